"""The on-machine proof (hf_rstitch.fast.proof) on the CPU's static path: the probe passes on zoo pairs, fails on a
lane perturbed in one layer -- and "auto" then returns the eager engine's tokens, the failure stored -- and its
verdicts decide later calls; the store (hf_rstitch.fast.proof_store) survives concurrent writers and torn files."""

import json
import logging
import multiprocessing

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.cli import env
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, proof, proof_store, support
from hf_rstitch.fast import engine as fast_engine
from hf_rstitch.fast.lane import FastLane
from zoo_models import build_pair, pick_threshold, prompts, stitched

STATIC = FastConfig(graphs=False)


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(proof_store.ENV, str(tmp_path / "proofs"))
    return tmp_path / "proofs"


def _lanes(llm, slm, batch):
    vocab = llm.config.get_text_config().vocab_size
    return {Role.SLM: FastLane(slm, Role.SLM, vocab, 64, STATIC, max_rows=batch),
            Role.LLM: FastLane(llm, Role.LLM, vocab, 64, STATIC, max_rows=batch)}


def _probe(llm, slm, batch=3):
    ids, mask = prompts(batch)
    return proof.probe(_lanes(llm, slm, batch), {Role.LLM: llm, Role.SLM: slm}, ids, mask)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "granitemoe", "gpt2"])
def test_probe_passes_on_zoo_pairs(model_type):
    llm, slm = build_pair(model_type)
    metrics = _probe(llm, slm)
    assert proof.failure(metrics, torch.float32) is None, metrics
    ids, _ = prompts(3)
    assert {m["steps"] for m in metrics.values()} == {ids.shape[1] - 4}  # after the longest left padding (4)


@pytest.fixture
def perturbed(monkeypatch):
    """A test double: the fast lane's forwards add noise to the output of one decoder layer (layer 1)."""
    state = {"on": False}
    forward = FastLane.forward

    def noisy_forward(self, *args, **kwargs):
        state["on"] = True
        try:
            return forward(self, *args, **kwargs)
        finally:
            state["on"] = False

    def hook(module, args, output):
        if not state["on"]:
            return output
        hidden = output[0] if isinstance(output, tuple) else output
        noisy = hidden + 0.5 * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
        return (noisy, *output[1:]) if isinstance(output, tuple) else noisy

    monkeypatch.setattr(FastLane, "forward", noisy_forward)
    return hook


def test_probe_fails_on_a_perturbed_lane(perturbed):
    llm, slm = build_pair("llama")
    llm.model.layers[1].register_forward_hook(perturbed)
    reason = proof.failure(_probe(llm, slm), torch.float32)
    assert reason is not None and reason.startswith("llm ")


def _auto_on_cpu(monkeypatch):
    """Make "auto" treat the CPU pair as unproven-but-provable (on a GPU: an architecture or capability outside
    the proven lists), on the static path."""
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda llm, slm, batch=1: "unproven here (test)")
    monkeypatch.setattr(support, "why_not_fast", lambda llm, slm, batch=1, proven=True: None)
    monkeypatch.setattr(fast_engine, "AUTO", STATIC)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_failed_proof_runs_eager_with_its_tokens_and_is_stored(monkeypatch, perturbed, caplog, store, decoding):
    llm, slm = build_pair("llama")
    threshold = pick_threshold(slm)
    eager = stitched(llm, slm, decoding, 3, threshold, "default")
    llm.model.layers[1].register_forward_hook(perturbed)
    _auto_on_cpu(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="hf_rstitch.fast"):
        auto = stitched(llm, slm, decoding, 3, threshold, None)
    assert torch.equal(auto[0], eager[0]) and auto[1] == eager[1]
    assert "proof on this machine failed" in caplog.text
    (record,) = proof_store.entries()
    assert record["passed"] is False and record["reason"].startswith("llm ")
    fresh_llm, fresh_slm = build_pair("llama")  # another process: no in-process memory, the stored failure decides
    reason, chosen = proof.unproven(fresh_llm, fresh_slm, 3, "unproven (test)", STATIC, fast_engine.engine_for)
    assert chosen is None and "its proof on this machine failed (llm " in reason


def test_passed_proof_runs_fast_and_later_calls_skip_the_probe(monkeypatch):
    llm, slm = build_pair("qwen2")
    threshold = pick_threshold(slm)
    eager = stitched(llm, slm, "greedy", 3, threshold, "default")
    _auto_on_cpu(monkeypatch)
    probes = []
    real = proof.probe
    monkeypatch.setattr(proof, "probe", lambda *a: probes.append(1) or real(*a))
    first = stitched(llm, slm, "greedy", 3, threshold, None)
    second = stitched(llm, slm, "greedy", 3, threshold, None)
    assert torch.equal(first[0], eager[0]) and torch.equal(second[0], eager[0]) and first[1] == eager[1]
    assert probes == [1]
    (record,) = proof_store.entries()
    assert record["passed"] and record["key"]["llm"] == ["qwen2", "torch.float32"]
    assert "qwen2/qwen2 float32" in proof_store.describe(record) and "passed" in proof_store.describe(record)
    assert proof.unproven(llm, slm, 3, "unproven", STATIC, fast_engine.engine_for) == (None, STATIC)
    lines = env.proofs()  # what rstitch env prints
    assert list(lines) == ["fast engine proof 1"] and "passed" in lines["fast engine proof 1"]


def test_off_and_hard_refusals_keep_the_eager_engine(monkeypatch):
    llm, slm = build_pair("llama")
    monkeypatch.setenv(proof.ENV, "off")
    assert proof.unproven(llm, slm, 1, "why", STATIC, fast_engine.engine_for) == ("why", None)
    monkeypatch.delenv(proof.ENV)
    # the CPU: no probe lifts "not on CUDA"
    assert proof.unproven(llm, slm, 1, "why", STATIC, fast_engine.engine_for) == ("why", None)


def _write(folder, i):
    import os
    os.environ[proof_store.ENV] = folder
    for j in range(20):
        proof_store.save({"n": j % 4}, bool(i % 2), None if i % 2 else "r", {"writer": i}, 0.1)


def test_store_survives_concurrent_writers_and_torn_files(store):
    context = multiprocessing.get_context("fork")  # writers that start at once
    workers = [context.Process(target=_write, args=(str(store), i)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    for n in range(4):  # one whole record a key, from one of the writers
        record = proof_store.load({"n": n})
        assert record is not None and record["key"] == {"n": n} and record["metrics"]["writer"] in range(4)
    assert not list(store.glob("*.tmp"))
    path = store / f"{proof_store.digest({'n': 0})}.json"
    path.write_text(path.read_text()[:25])  # torn: a crash mid-write by something that did not rename
    assert proof_store.load({"n": 0}) is None  # no proof: the probe runs again
    assert any(e.get("unreadable") for e in proof_store.entries())
    proof_store.save({"n": 0}, True, None, {}, 0.2)
    assert proof_store.load({"n": 0})["passed"] is True
    assert json.loads(path.read_text())["key"] == {"n": 0}


def test_a_request_engine_on_an_unproven_pair_builds_and_proves_its_lanes_once(monkeypatch):
    """``rstitch serve`` on a GPU outside the proven lists: the request engine's "auto" proves the fast engine on a
    synthetic prompt. Its build warms the lanes up and the request engine then takes them: one set of lanes (one
    set of KV pools, which the server sizes to fill the GPU's free memory: a second set would not fit) and one
    probe, not one of each a call."""
    from hf_rstitch.batching import Request, RequestEngine

    llm, slm = build_pair("qwen2")
    _auto_on_cpu(monkeypatch)
    built, probes = [], []
    real_init, real_probe = FastLane.__init__, proof.probe
    monkeypatch.setattr(FastLane, "__init__", lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(proof, "probe", lambda *a: probes.append(1) or real_probe(*a))
    engine = RequestEngine.of(llm, slm, max_batch=2, max_length=64)
    assert engine.engine.kind == "fast" and engine.engine.choice.proving
    lanes = dict(engine.lanes)
    assert engine.engine.lanes() == lanes  # the same lanes, reset, whoever asks
    assert probes == [1]
    assert len(built) == 2  # a lane a model (their join twins come at the first join)
    done = engine.run([Request([5, 6, 7, 8], max_new_tokens=6, eos_token_id=[])])
    assert len(next(iter(done.values())).tokens) == 6


def test_a_stored_proof_does_not_depend_on_virtual_joins():
    """A proof runs ``generate``, which joins no rows: its key names the config without ``virtual_joins``
    (``FastConfig.key``), so proofs stored under one setting hold under another; any other field still counts."""
    llm, slm = build_pair("llama")

    def key(**fields):
        return proof_store.key_for(llm, slm, FastConfig(graphs=False, **fields), "cpu")

    assert key(virtual_joins=64) == key(virtual_joins=0) == key()
    assert key(max_bucket=8) != key()
    assert FastConfig(virtual_joins=64).key() == repr(FastConfig(virtual_joins=0))
