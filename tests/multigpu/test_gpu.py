"""The same equalities on real GPUs: an LLM split over two GPUs with a device_map, and two NCCL ranks
of tensor parallelism, each equal to the one-GPU run. Skipped without two CUDA devices."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.decode import Lane
from hf_rstitch.hf.placement import check_placement, describe

from multigpu.cases import batch_with_early_stop, mixing_tau, stitched, tiny_pair, write_case
from tiny_models import prompt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]


def split_map(llm) -> dict:
    """Embeddings and layer 0 on cuda:0; the other layers, the norm and the head on cuda:1."""
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.norm": 1, "lm_head": 1}
    dmap.update({f"model.layers.{i}": 1 for i in range(1, len(llm.model.layers))})
    return dmap


def load_split(folder):
    """The tiny LLM through from_pretrained with split_map, as a user loads a sharded model."""
    llm, _ = tiny_pair()
    llm.save_pretrained(folder)
    llm = type(llm).from_pretrained(folder, dtype=torch.float64, device_map=split_map(llm))
    assert {p.device for p in llm.parameters()} == {torch.device("cuda", 0), torch.device("cuda", 1)}
    return llm


def one_gpu_pair():
    llm, slm = (m.to("cuda:0") for m in tiny_pair())
    ids = prompt(11, seed=3).to("cuda:0")
    return llm, slm, ids, mixing_tau(llm, slm, ids)


def test_device_map_over_two_gpus_equals_one_gpu(tmp_path):
    llm, slm, ids, tau = one_gpu_pair()
    ref = stitched(llm, slm, ids, tau)
    llm2, slm2 = load_split(tmp_path), tiny_pair()[1].to("cuda:1")  # SLM beside the LLM's last layers
    check_placement(llm2, slm2, ids)
    assert describe(llm2).startswith("device_map")
    out = stitched(llm2, slm2, ids, tau)
    assert torch.equal(out.sequences, ref.sequences) and out.stitch.roles == ref.stitch.roles


def test_device_map_batch_drops_finished_rows_on_both_gpus(tmp_path):
    llm, slm, _, tau = one_gpu_pair()
    ids, mask, eos = batch_with_early_stop(llm, slm, tau)
    ids, mask = ids.to("cuda:0"), mask.to("cuda:0")
    ref = stitched(llm, slm, ids, tau, mask, eos_token_id=eos, pad_token_id=2)
    llm2, slm2 = load_split(tmp_path), tiny_pair()[1].to("cuda:1")
    out = stitched(llm2, slm2, ids, tau, mask, eos_token_id=eos, pad_token_id=2)
    assert torch.equal(out.sequences, ref.sequences)
    assert [t.roles for t in out.stitch] == [t.roles for t in ref.stitch]


def test_each_cache_layer_lives_with_its_layer(tmp_path):
    llm = load_split(tmp_path)
    lane = Lane(llm, Role.LLM, vocab=llm.config.vocab_size)
    ids = prompt(11, seed=3).to("cuda:0")
    logits, _, _ = lane.advance(ids, torch.ones_like(ids), rows=torch.tensor([True]), resumed=torch.tensor([False]))
    assert logits.device == ids.device
    for i, layer in enumerate(lane.cache.layers):
        assert layer.keys.device == torch.device("cuda", 0 if i == 0 else 1)  # split_map's layout
        assert layer.keys.shape[-2] == ids.shape[1]


def test_tensor_parallel_over_two_gpus_equals_one_gpu(tmp_path):
    from multigpu.test_tp_gloo import check_ranks, reference, run_ranks

    llm, slm = tiny_pair()
    case = write_case(tmp_path, llm, slm)
    ref = reference(llm.to("cuda:0"), slm.to("cuda:0"), case, device="cuda:0")
    ranks = run_ranks(tmp_path, cuda=True)
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    check_ranks(ranks, ref)
