"""The tuner's candidates compiled in parallel threads before they are timed (triton_support.precompile)."""

import functools

import pytest
import torch

from hf_rstitch.fast.kernels import triton_support as ts

CUDA = torch.cuda.is_available()


class FakeKernel:
    def __getitem__(self, grid):
        return ("launch", grid)

    def warmup(self, *args, grid, **kwargs):
        return ("compile", grid, args, kwargs)


def test_start_launches_outside_and_compiles_inside(monkeypatch):
    """start(kernel, grid) is kernel[grid]; inside compile_ahead it compiles the same launch and runs nothing."""
    kernel = FakeKernel()
    assert ts.start(kernel, (4,)) == ("launch", (4,))
    monkeypatch.setattr(ts._ahead, "on", True, raising=False)
    compile_only = ts.start(kernel, (4, 2))
    assert isinstance(compile_only, functools.partial)
    assert compile_only(1, 2, BLOCK=8) == ("compile", (4, 2), (1, 2), {"BLOCK": 8})


@pytest.mark.parametrize("why", ["cpu", "one thread", "one candidate"])
def test_precompile_skips_where_it_cannot_help(monkeypatch, why):
    """Off CUDA (the interpreter compiles nothing), with one thread, or for one candidate nothing runs ahead."""
    calls = []
    device, candidates = "cpu", ["a", "b"]
    if why != "cpu":
        device = "cuda"
        monkeypatch.setattr(ts, "interpreted", lambda: False)
    if why == "one thread":
        monkeypatch.setattr(ts, "COMPILE_THREADS", 1)
    if why == "one candidate":
        candidates = ["a"]
    ts.precompile([(candidates, calls.append)], device)
    assert calls == []


def test_compile_threads_default_and_override(monkeypatch):
    """HF_RSTITCH_COMPILE_THREADS sets the threads; by default one per core, at most 16; a bad value says what
    it takes."""
    import os

    monkeypatch.setenv("HF_RSTITCH_COMPILE_THREADS", "3")
    assert ts._threads_from_env() == 3
    monkeypatch.delenv("HF_RSTITCH_COMPILE_THREADS")
    assert ts._threads_from_env() == min(16, os.cpu_count() or 1)
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("HF_RSTITCH_COMPILE_THREADS", bad)
        with pytest.raises(ValueError, match="positive whole number"):
            ts._threads_from_env()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("rows", [8, 64])
def test_pending_lists_what_the_plans_tune(arch, fuse, rows):
    """linears.pending / gated_mlp.pending name each shape and tier the plans then tune, once each, with the
    candidates of its tier; and nothing once the table holds them."""
    from tiny_models import kernel_model

    from hf_rstitch.fast.kernels import gated, gemv, shortlist
    from hf_rstitch.fast.patches import gated_mlp, linears

    model = kernel_model("cpu", arch)
    jobs = linears.pending(model, {}, fuse, rows)
    keys = [gemv.shape_key(run.args[1], run.args[2], run.args[0].shape[0]) for _, run in jobs]
    assert all(candidates == shortlist.candidates("gemv", key[-1], gemv.TIER_CANDIDATES) for (candidates, _), key in zip(jobs, keys))
    mlp_jobs = gated_mlp.pending(model, {}, rows)
    keys += [gated._key(run.args[1], run.args[0].shape[0]) for _, run in mlp_jobs]
    table = {}
    linears.plan(model, table, fuse=fuse, max_rows=rows)  # off CUDA the tuner picks a default without timing
    gated_mlp.plan(model, table, max_rows=rows)
    assert len(keys) == len(set(keys)) and set(keys) == set(table)
    assert linears.pending(model, table, fuse, rows) == [] and gated_mlp.pending(model, table, rows) == []


@pytest.mark.skipif(not CUDA, reason="needs CUDA (Triton compiles for a GPU)")
@pytest.mark.parametrize("kind", ["gemv", "gated"])
def test_tuning_after_precompile_builds_nothing(monkeypatch, kind):
    """With fresh kernel objects, precompile builds every candidate's kernels (in threads), and the timing loop
    that follows builds none: each launch finds its kernel compiled."""
    pytest.importorskip("triton")
    from triton import knobs

    from hf_rstitch.fast.kernels import gated, gemv

    monkeypatch.setattr(ts, "COMPILE_THREADS", 4)
    for module in (gemv, gated):  # fresh JIT objects: no kernel compiled in this process yet
        module._kernel.cache_clear()
        module._few_rows_kernel.cache_clear()
    built = []
    monkeypatch.setattr(knobs.compilation, "listener",
                        lambda *, src, metadata, metadata_group, times, cache_hit: built.append(src.fn.__name__))
    w = torch.randn(192, 320, dtype=torch.bfloat16, device="cuda")
    u = torch.randn_like(w)
    x1, x16 = (torch.randn(r, 320, dtype=torch.bfloat16, device="cuda") for r in (1, 16))
    if kind == "gemv":
        jobs = [(gemv.CANDIDATES, lambda c: gemv.launch(x1, w, None, c)),
                (gemv.FEW_ROWS, lambda c: gemv.launch(x16, w, None, c))]
    else:
        jobs = [(gated.CANDIDATES, lambda c: gated.launch(x1, w, u, c)),
                (gated.FEW_ROWS, lambda c: gated.launch(x16, w, u, c))]
    try:
        ts.precompile(jobs, "cuda")
        ahead = len(built)
        assert ahead >= len(jobs[0][0])  # at least one kernel a one-row candidate
        for candidates, run in jobs:
            assert ts.fastest(candidates, run, calls=2) is not None
        assert len(built) == ahead  # nothing more to build
    finally:
        for module in (gemv, gated):
            module._kernel.cache_clear()
            module._few_rows_kernel.cache_clear()


@pytest.mark.skipif(not CUDA, reason="needs CUDA (Triton compiles for a GPU)")
def test_attention_launches_after_precompile_build_nothing(monkeypatch):
    """decode_attention.pending covers every batch and length bucket: after its precompile the real launches of
    those shapes (the layout the rotary functions give the query) build no kernel."""
    pytest.importorskip("triton")
    from tiny_models import kernel_model
    from triton import knobs

    from hf_rstitch.fast.kernels import decode_attention as da
    from hf_rstitch.fast.static_kv import StaticKV

    monkeypatch.setattr(ts, "COMPILE_THREADS", 4)
    da._kernels.cache_clear()
    built = []
    monkeypatch.setattr(knobs.compilation, "listener",
                        lambda *, src, metadata, metadata_group, times, cache_hit: built.append(src.fn.__name__))
    model = kernel_model("cuda", "qwen2").to(torch.bfloat16)
    cache = StaticKV(model.config, 256, torch.bfloat16, torch.device("cuda"), rows=4)
    pad = torch.zeros(4, dtype=torch.long, device="cuda")
    cache.pos.fill_(40)
    jobs = da.pending(cache.keys[0], cache.values[0], cache.pos, pad, 4, (1, 2, 4), (1, 2, 4, 8))
    try:
        ts.precompile(jobs, "cuda")
        ahead = len(built)
        assert ahead >= 2
        for b, q, _window in jobs[0][0]:
            query = torch.randn(b, q, 4, 16, dtype=torch.bfloat16, device="cuda").transpose(1, 2).contiguous()
            torch.ops.hf_rstitch.decode_attention(query, cache.keys[0][:b], cache.values[0][:b], cache.pos, pad[:b],
                                                  0.25)
        torch.cuda.synchronize()
        assert len(built) == ahead
    finally:
        da._kernels.cache_clear()


class FakeCompiled:
    """A compiled Triton kernel as prepare_launchers sees it: an argument signature and a lazy launcher."""

    def __init__(self, signature, fails=False):
        self.src = type("Src", (), {"signature": signature})()
        self._run, self.fails, self.prepared = None, fails, 0

    def _init_handles(self):
        self.prepared += 1
        if self.fails:
            raise RuntimeError("out of resources")
        self._run = "launcher"


def test_prepare_launchers_builds_one_per_signature():
    """One launcher per distinct argument signature is built ahead (constexpr values do not change a launcher);
    kernels already prepared are left alone, and one that cannot be prepared is left for its launch."""
    from concurrent.futures import ThreadPoolExecutor

    a = [FakeCompiled({"x": "*bf16", "N": "i32", "BLOCK": "constexpr"}) for _ in range(3)]
    b = FakeCompiled({"x": "*bf16", "N": "i64", "BLOCK": "constexpr"})
    done = FakeCompiled({"y": "*fp32"})
    done._run = "launcher"
    bad = FakeCompiled({"z": "*fp16"}, fails=True)
    with ThreadPoolExecutor(2) as pool:
        assert ts.prepare_launchers(a + [b, done, bad, object()], pool) == 2
    assert [k.prepared for k in a] == [1, 0, 0] and b.prepared == 1 and done.prepared == 0 and bad.prepared == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_pending_held_lists_the_choices_the_table_holds(arch):
    """With held=True, pending names each shape and tier the table holds a kernel's configuration for, with that
    one configuration (built ahead, not at the first capture); a tier where cuBLAS won needs no kernel."""
    from tiny_models import kernel_model

    from hf_rstitch.fast.kernels import gated, gemv
    from hf_rstitch.fast.patches import gated_mlp, linears

    model = kernel_model("cpu", arch)
    assert linears.pending(model, {}, True, 1, held=True) == [] and gated_mlp.pending(model, {}, 1, held=True) == []
    table = {}
    linears.plan(model, table, fuse=True, max_rows=1)
    gated_mlp.plan(model, table, max_rows=1)
    cublas = next(k for k in table if k[-1] == gemv.MAX_ROWS)
    table[cublas] = None
    jobs = linears.pending(model, table, True, 1, held=True) + gated_mlp.pending(model, table, 1, held=True)
    keys = [gemv.shape_key(run.args[1], run.args[2], run.args[0].shape[0]) if run.func is gemv.launch
            else gated._key(run.args[1], run.args[0].shape[0]) for _, run in jobs]
    assert sorted(map(repr, keys)) == sorted(repr(k) for k, v in table.items() if v is not None)
    assert all(candidates == (table[key],) for (candidates, _), key in zip(jobs, keys))


def test_lanes_time_the_shortlist_and_full_tuning_the_search_space(monkeypatch):
    """A lane times each tier's shortlist (the whole space where it has none); HF_RSTITCH_TUNE=full times the whole
    search space (what the shipped tables are made with); anything else says what it takes. Every shortlisted
    candidate is in the space."""
    from hf_rstitch.fast.kernels import gated, gemv, shortlist

    for kind, space in (("gemv", gemv.TIER_CANDIDATES), ("gated", gated.TIER_CANDIDATES)):
        for top in gemv.TIERS:
            short = shortlist.SHORTLISTS[kind][top]
            assert short is None or set(short) <= set(space[top])
            monkeypatch.delenv(shortlist.ENV, raising=False)
            assert shortlist.candidates(kind, top, space) == (short or space[top])
            monkeypatch.setenv(shortlist.ENV, "full")
            assert shortlist.candidates(kind, top, space) == space[top]
    monkeypatch.setenv(shortlist.ENV, "all of them")
    with pytest.raises(ValueError, match="'full'"):
        shortlist.candidates("gemv", 1, gemv.TIER_CANDIDATES)
