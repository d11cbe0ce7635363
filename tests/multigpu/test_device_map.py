"""An LLM dispatched by accelerate (hooks, offloaded layers) stitches exactly like the plain model.

On CPU every module's execution device is the CPU, so these tests cover accelerate's hooks,
disk-offloaded layers and ``hf_device_map`` handling; moving activations between GPUs is left to
``test_gpu.py``.
"""

import pytest
import torch
from accelerate import dispatch_model, infer_auto_device_map
from accelerate.utils import compute_module_sizes

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.hf.placement import check_placement, describe, is_sharded

from multigpu.cases import batch_with_early_stop, mixing_tau, stitched, tiny_pair
from tiny_models import prompt

pytestmark = pytest.mark.slow  # 9 s module fixture + 8 s of dispatched runs


@pytest.fixture(scope="module")
def reference():
    llm, slm = tiny_pair()
    ids = prompt(11, seed=3)
    tau = mixing_tau(llm, slm, ids)
    b_ids, b_mask, eos = batch_with_early_stop(llm, slm, tau)
    batch_kw = dict(eos_token_id=eos, pad_token_id=2)
    return {"ids": ids, "tau": tau, "single": stitched(llm, slm, ids, tau), "b_ids": b_ids, "b_mask": b_mask,
            "batch_kw": batch_kw, "batch": stitched(llm, slm, b_ids, tau, b_mask, **batch_kw)}


def explicit_map(llm) -> dict[str, str]:
    """Embeddings and the first layer on the CPU, the other layers and the head offloaded to disk."""
    layers = len(llm.model.layers)
    dmap = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.norm": "disk",
            "lm_head": "disk"}
    dmap.update({f"model.layers.{i}": "disk" for i in range(1, layers)})
    return dmap


def auto_map(llm) -> dict[str, str]:
    """infer_auto_device_map with a CPU budget of the embeddings plus one layer; the rest goes to disk."""
    sizes = compute_module_sizes(llm)
    budget = sizes["model.embed_tokens"] + sizes["model.layers.0"] + 1024
    return infer_auto_device_map(llm, max_memory={"cpu": budget}, no_split_module_classes=llm._no_split_modules)


def assert_same(out, ref):
    assert torch.equal(out.sequences, ref.sequences)
    traces, refs = (out.stitch, ref.stitch) if isinstance(out.stitch, list) else ([out.stitch], [ref.stitch])
    for t, r in zip(traces, refs):
        assert t.roles == r.roles and t.handovers == r.handovers
        costs = [[(c.role, c.kind, c.n_inf, c.n_kv) for c in trace.calls] for trace in (t, r)]
        assert costs[0] == costs[1]


def dispatch(model, dmap, folder, **kw):
    """As ``from_pretrained(device_map=...)`` calls accelerate (the cache argument is never moved)."""
    return dispatch_model(model, dmap, offload_dir=str(folder), skip_keys=model._skip_keys_device_placement, **kw)


@pytest.mark.parametrize("layout", ["hooks-only", "explicit-disk", "auto-disk", "from_pretrained"])
def test_dispatched_llm_equals_plain(layout, reference, tmp_path):
    llm, slm = tiny_pair()
    if layout == "hooks-only":  # accelerate's hooks on every block, nothing offloaded
        llm = dispatch(llm, {name: "cpu" for name in explicit_map(llm)}, tmp_path, force_hooks=True)
        assert hasattr(llm.model.layers[1], "_hf_hook")
    else:
        dmap = auto_map(llm) if layout == "auto-disk" else explicit_map(llm)
        assert "disk" in dmap.values() and dmap.get("model.embed_tokens") == "cpu", dmap
        if layout == "from_pretrained":
            llm.save_pretrained(tmp_path / "llm")
            llm = type(llm).from_pretrained(tmp_path / "llm", dtype=torch.float64, device_map=dmap,
                                            offload_folder=str(tmp_path / "offload"))
            assert llm.hf_device_map == dmap
        else:
            llm = dispatch(llm, dmap, tmp_path)
        assert torch.device("meta") in {p.device for p in llm.parameters()}  # really offloaded
        assert is_sharded(llm) and describe(llm).startswith("device_map")
    check_placement(llm, slm, reference["ids"])
    tau = reference["tau"]
    assert_same(stitched(llm, slm, reference["ids"], tau), reference["single"])
    batch = stitched(llm, slm, reference["b_ids"], tau, reference["b_mask"], **reference["batch_kw"])
    assert_same(batch, reference["batch"])


def test_dispatched_slm_equals_plain(reference, tmp_path):
    llm, slm = tiny_pair()
    slm = dispatch(slm, {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                         "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}, tmp_path)
    check_placement(llm, slm, reference["ids"])
    assert_same(stitched(llm, slm, reference["ids"], reference["tau"]), reference["single"])
