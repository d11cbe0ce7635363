"""Layouts stitched decoding refuses, each with an error that says what to change.

Tensor-parallel layouts that need several GPUs are simulated: the LLM carries a stand-in device
mesh the way transformers records one (``_device_mesh``, ``_tp_size``). Every refusal here fires
before the one collective the check makes, so no process group is needed.
"""

import inspect
from types import SimpleNamespace

import pytest
import torch
from accelerate import dispatch_model

import hf_rstitch  # noqa: F401  (patches generate)
import hf_rstitch.hf.decode as decode
from hf_rstitch.hf import placement
from hf_rstitch.hf.placement import check_placement, describe, is_sharded, tp_mesh

from multigpu.cases import tiny_pair
from tiny_models import prompt

IDS = prompt(11, seed=3)


class StandInMesh:
    """What the checks read from a ``DeviceMesh``: its ranks and device type."""

    def __init__(self, ranks, device_type="cuda"):
        self.mesh = torch.tensor(ranks)
        self.device_type = device_type
        self.ndim = 1
        self.mesh_dim_names = ("tp",)

    def size(self):
        return self.mesh.numel()


def as_tensor_parallel(model, ranks=(0, 1)):
    model._device_mesh, model._tp_size = StandInMesh(list(ranks)), len(ranks)
    return model


def embeddings_on_disk(model, folder):
    dmap = {"model.embed_tokens": "disk", "model.rotary_emb": "cpu", "model.layers": "cpu", "model.norm": "cpu",
            "lm_head": "cpu"}
    return dispatch_model(model, dmap, offload_dir=str(folder))


def test_plain_models_pass_and_describe_themselves():
    llm, slm = tiny_pair()
    check_placement(llm, slm, IDS, do_sample=True, engine="fast")  # one device: every engine is fine
    assert tp_mesh(llm) is None and not is_sharded(llm) and describe(llm) == "cpu"
    assert describe(as_tensor_parallel(llm)) == "tensor-parallel x2 (this rank: cpu)"


def test_offloaded_input_embeddings_are_refused(tmp_path):
    llm, slm = tiny_pair()
    llm = embeddings_on_disk(llm, tmp_path)
    assert llm.device.type == "meta"
    with pytest.raises(ValueError, match=r"llm's first parameter `model.embed_tokens.weight` is offloaded") as e:
        check_placement(llm, slm, IDS)
    assert "offload only later layers" in str(e.value)


def test_weights_never_loaded_are_refused():
    llm, slm = tiny_pair()
    with torch.device("meta"):
        empty = type(slm)(slm.config)
    with pytest.raises(ValueError, match=r"slm's weights are on the 'meta' device.*from_pretrained"):
        check_placement(llm, empty, IDS)


def test_fast_engine_refuses_sharded_models(tmp_path):
    llm, slm = tiny_pair()
    llm = dispatch_model(llm, {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers": "disk",
                               "model.norm": "cpu", "lm_head": "cpu"}, offload_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"stitch_engine='fast' runs single-device models only.*'default'"):
        check_placement(llm, slm, IDS, engine="fast")
    check_placement(llm, slm, IDS, engine="default")


@pytest.mark.parametrize("kind, words", [("fsdp_size", "FSDP"), ("pp_size", "pipeline parallelism")])
def test_fsdp_and_pipeline_parallel_are_refused(kind, words):
    llm, slm = tiny_pair()
    sizes = {"fsdp_size": 1, "pp_size": 1, kind: 2}
    llm.config.distributed_config = SimpleNamespace(**sizes)
    with pytest.raises(ValueError, match=rf"llm runs under {words}.*tp_plan='auto'"):
        check_placement(llm, slm, IDS)


def test_tp_slm_must_sit_on_the_ranks_local_device(monkeypatch):
    llm, slm = tiny_pair()
    as_tensor_parallel(llm)
    real = placement.devices
    monkeypatch.setattr(placement, "devices", lambda m: {torch.device("cuda", 0)} if m is slm else real(m))
    with pytest.raises(ValueError, match=r"local device cpu .* but the SLM is on cuda:0.*LOCAL_RANK") as e:
        check_placement(llm, slm, IDS)
    assert "do not offload or split it" in str(e.value)


def test_tp_slm_split_over_devices_is_refused(monkeypatch):
    llm, slm = tiny_pair()
    as_tensor_parallel(llm)
    real = placement.devices
    monkeypatch.setattr(placement, "devices", lambda m: {torch.device("cpu"), torch.device("meta")} if m is slm
                        else real(m))
    with pytest.raises(ValueError, match=r"but the SLM is on cpu, meta"):
        check_placement(llm, slm, IDS)


def test_tp_slm_on_another_mesh_is_refused():
    llm, slm = tiny_pair()
    as_tensor_parallel(llm, ranks=(0, 1, 2, 3))
    as_tensor_parallel(slm, ranks=(0, 1))
    with pytest.raises(ValueError, match=r"SLM is tensor-parallel over ranks \[0, 1\].*LLM over ranks \[0, 1, 2, 3\]"):
        check_placement(llm, slm, IDS)


@pytest.mark.skipif("check_placement" not in inspect.getsource(decode),
                    reason="hf_rstitch/hf/decode.py does not call check_placement yet")
def test_generate_runs_the_check(tmp_path):
    llm, slm = tiny_pair()
    llm = embeddings_on_disk(llm, tmp_path)
    with pytest.raises(ValueError, match="offload only later layers"):
        llm.generate(IDS, assistant_model=slm, stitch_threshold=0.5, max_new_tokens=4)
