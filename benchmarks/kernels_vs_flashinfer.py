"""Our Triton kernels against FlashInfer's on the same shapes: decode attention, add + RMSNorm, rotary, gated MLP.

    PYTHONPATH=.:benchmarks python benchmarks/kernels_vs_flashinfer.py --out-dir $OUT [--budget-s 190]
        [--families attention add_norm rope gated] [--shapes qwen3-0.6b ...] [--batches 1 8 64]
    PYTHONPATH=.:benchmarks python benchmarks/kernels_vs_flashinfer.py --dry-run-cpu --out-dir /tmp/k  # checks the script

The question (issue 39, item 2): does a hand-written kernel of the fast engine beat the field's library on the
shapes we run? Shapes: the attention and MLP dimensions of Qwen3-0.6B, Qwen2-1.5B, Qwen2-7B and Qwen3-8B
(:data:`SHAPES`), batch 1, 8 and 64, bf16, one decode token a row. Per family, like with like:

* ``attention``: :func:`hf_rstitch.fast.kernels.decode_attention._launch` (split-K over the static cache, which reads the
  written slots; ``[rows, kv_heads, slots, dim]``) against FlashInfer's paged decode
  (``BatchDecodeWithPagedKVCacheWrapper``, CUDA-graph mode) twice: over the very same cache tensors as pages
  (``HND``, one page a row: no copy; :class:`hf_rstitch.fast.flashinfer_decode.PagedDecode`, tensor cores), and over
  FlashInfer's own layout, pages of 16 (a copy of the same keys and values), CUDA-core and tensor-core decode;
  at batch 1 also ``single_decode_with_kv_cache`` over our row. KV lengths 512, 4096 and 32768.
  FlashInfer's ``plan`` (host work each step, outside any CUDA graph) is timed apart (``plan_us``).
* ``add_norm``: ours is a compiled piece (``torch.compile`` of :func:`hf_rstitch.fast.patches.add_norm._add_norm`: the
  residual add rounded to bf16, then the model's RMSNorm) against ``flashinfer.norm.fused_add_rmsnorm`` (in place).
* ``rope``: :func:`hf_rstitch.fast.kernels.rope_store.rotate_qk` (q and k rotated, out of place, bf16 cos/sin as
  transformers gives them) against ``flashinfer.rope.apply_rope_with_cos_sin_cache`` (float32 cos/sin cache); and
  :func:`~hf_rstitch.fast.kernels.rope_store.rope_store` (rotate and write k, v into the cache: one launch) against
  ``apply_rope_with_cos_sin_cache_inplace`` + ``flashinfer.page.append_paged_kv_cache`` (two launches).
* ``gated``: ours fuses the gate and up products with the activation (:func:`hf_rstitch.fast.kernels.gated.launch`, the
  configuration its tuner picks for the row tier; where the tuner keeps cuBLAS, that is what ours runs) against
  cuBLAS over the concatenated gate/up weight + ``flashinfer.activation.silu_and_mul``; and the activation alone:
  ``silu_and_mul`` against the compiled ``silu(g) * u`` (what ``compile="parts"`` runs without the fused MLP).

Every kernel's output is first checked against a float32 reference (``agree``, the largest error); then each is
timed as a CUDA graph replay (``triton.testing.do_bench_cudagraph``, launch overhead out, as the engine runs
them; ``do_bench`` where a capture fails). The first call of each kernel (FlashInfer's JIT build with nvcc,
Triton's compile) is timed apart (``first_call_s``). A kernel that fails records its error; the run goes on.
Writes ``kernels_vs_flashinfer_<gpu>.json`` and ``.md``; prints the table and one compact JSON document last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass
import sys
from pathlib import Path

if "--dry-run-cpu" in sys.argv:  # Triton's interpreter must be chosen before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"

import lab  # noqa: E402


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float = 1e-6
    theta: float = 1e6


SHAPES = {"qwen3-0.6b": Shape(1024, 16, 8, 128, 3072), "qwen2-1.5b": Shape(1536, 12, 2, 128, 8960),
          "qwen2-7b": Shape(3584, 28, 4, 128, 18944), "qwen3-8b": Shape(4096, 32, 8, 128, 12288)}
TINY = {"tiny": Shape(64, 4, 2, 16, 96)}  # --dry-run-cpu
FAMILIES = ("attention", "add_norm", "rope", "gated")
TOL = 3e-2  # bf16 outputs against a float32 reference: largest absolute error relative to the reference's scale


class Run:
    """Device, budget, timing and the result rows of one run."""

    def __init__(self, args):
        import torch

        self.torch, self.args = torch, args
        self.device = "cpu" if args.dry_run_cpu else "cuda"
        self.dtype = torch.float32 if args.dry_run_cpu else torch.bfloat16  # the interpreter has no bfloat16
        self.start = time.perf_counter()
        self.rows: list[dict] = []
        self.first_calls: dict[str, float | str] = {}
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.start)

    def sync(self):
        lab.sync(self.device)

    def first(self, name: str, fn):
        """``fn()`` once, its seconds recorded under ``name`` the first time (JIT builds, Triton compiles)."""
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        self.first_calls.setdefault(name, time.perf_counter() - t0)
        return out

    def time_us(self, fn) -> tuple[float, str]:
        """Microseconds a call: a CUDA graph replay where ``fn`` captures, else eager launches; on CPU a loop."""
        if self.device == "cpu":
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return 1e6 * statistics.median(times), "cpu loop"
        import triton.testing as tt

        try:
            return 1e3 * tt.do_bench_cudagraph(fn, rep=self.args.rep_ms), "cuda graph"
        except Exception:  # noqa: BLE001  (a kernel that cannot be captured: eager launches)
            self.torch.cuda.synchronize()
            return 1e3 * tt.do_bench(fn, rep=self.args.rep_ms), "eager (capture failed)"

    def case(self, family: str, shape: str, batch: int, impl: str, fn, ref, extra: dict | None = None,
             includes: str = "") -> None:
        """Check ``fn()`` against ``ref`` (a float32 tensor, a list of them, or None: timing only) and time it; the
        row records both, or the error."""
        row = {"family": family, "shape": shape, "batch": batch, "impl": impl, "includes": includes, **(extra or {})}
        try:
            got = self.first(f"{family}/{impl}", fn)
            if ref is not None:  # None: a timing-only row (its check is the row before it)
                row["max_err"] = max_error(got, ref)
                row["agree"] = row["max_err"] <= TOL
            row["us"], row["timing"] = self.time_us(fn)
        except Exception as err:  # noqa: BLE001  (record it; the run goes on)
            row["error"] = f"{type(err).__name__}: {err}"[:400]
            self.torch.cuda.synchronize() if self.device == "cuda" else None
        self.rows.append(row)
        print(json.dumps(row), flush=True)


def max_error(got, ref) -> float:
    """Largest absolute error over ``ref``'s largest magnitude (outputs and references paired in lists)."""
    got = got if isinstance(got, (list, tuple)) else [got]
    ref = ref if isinstance(ref, (list, tuple)) else [ref]
    worst = 0.0
    for g, r in zip(got, ref):
        worst = max(worst, float((g.float() - r.float()).abs().max()) / max(1e-6, float(r.float().abs().max())))
    return worst


def flashinfer():
    """The flashinfer module, or None (not installed, or its import fails: the reason is kept)."""
    try:
        import flashinfer as fi
        import flashinfer.activation  # noqa: F401
        import flashinfer.norm  # noqa: F401
        import flashinfer.page  # noqa: F401
        import flashinfer.rope  # noqa: F401

        return fi
    except Exception as err:  # noqa: BLE001
        flashinfer.reason = f"{type(err).__name__}: {err}"[:300]
        return None


flashinfer.reason = ""


# ---- attention ------------------------------------------------------------------------------------------------
def attention_reference(q, keys, values, length: int, scale: float, rows) -> list:
    """float32 attention of query rows ``rows`` over the first ``length`` slots: ``[H, D]`` each."""
    out = []
    group = q.shape[1] // keys.shape[1]
    for b in rows:
        k = keys[b, :, :length].float().repeat_interleave(group, 0)  # [H, L, D]
        v = values[b, :, :length].float().repeat_interleave(group, 0)
        p = ((k @ q[b].float()[:, :, None]).squeeze(-1) * scale).softmax(-1)  # [H, L]
        out.append((p[:, None, :] @ v).squeeze(1))
    return out


def attention(run: Run, fi, name: str, s: Shape, batch: int, length: int) -> None:
    torch = run.torch
    from hf_rstitch.fast.kernels import decode_attention as da

    dev = run.device
    keys = torch.randn(batch, s.kv_heads, length, s.head_dim, dtype=run.dtype, device=dev)
    values = torch.randn_like(keys)
    q = torch.randn(batch, s.heads, s.head_dim, dtype=run.dtype, device=dev)  # [b, H, D]
    scale = s.head_dim ** -0.5
    rows = sorted({0, batch - 1})
    ref = attention_reference(q, keys, values, length, scale, rows)
    pos = torch.tensor(length - 1, device=dev)  # the new token's slot: slots [0, length) are read
    pad = torch.zeros(batch, dtype=torch.long, device=dev)
    extra = {"kv_len": length}
    run.case("attention", name, batch, "ours: split-K decode_attention",
             lambda: pick(da._launch(q[:, :, None], keys, values, pos, pad, scale)[:, 0], rows), ref, extra,
             "attention over the static cache's written slots (split + combine kernels)")
    if fi is None:
        return
    if batch == 1:
        run.case("attention", name, batch, "flashinfer: single_decode_with_kv_cache",
                 lambda: [fi.single_decode_with_kv_cache(q[0], keys[0], values[0], kv_layout="HND", sm_scale=scale)],
                 ref, extra, "one request, HND keys/values")
    from hf_rstitch.fast.flashinfer_decode import PagedDecode

    impl = "flashinfer: paged decode over our cache, a page a row (tensor cores)"
    try:  # FlashInfer splits a row's keys by pages: one page a row leaves B = 1 a handful of programs
        paged = PagedDecode(keys, values, s.heads, tensor_cores=True, cuda_graph=True)
        plan_us = host_us(lambda: paged.plan([length] * batch))
        run.case("attention", name, batch, impl, lambda: pick(paged.run(q[:, :, None])[:, 0], rows), ref,
                 {**extra, "plan_us": plan_us}, "hf_rstitch.fast.flashinfer_decode.PagedDecode over the same cache "
                 "tensors (no copy), planned on the host before")
    except Exception as err:  # noqa: BLE001
        run.rows.append({"family": "attention", "shape": name, "batch": batch, "impl": impl, **extra,
                         "error": f"plan: {type(err).__name__}: {err}"[:400]})
    native = pages(keys, values, PAGE)  # FlashInfer's own layout: a copy of the same keys and values
    for tc in (False, True):
        impl = f"flashinfer: paged decode, pages of {PAGE} ({'tensor cores' if tc else 'CUDA cores'})"
        try:
            wrapper, plan = native_wrapper(run, fi, s, batch, length, tc)
            plan_us = host_us(plan)
            run.case("attention", name, batch, impl, lambda: pick(wrapper.run(q, native), rows), ref,
                     {**extra, "plan_us": plan_us, "page_size": PAGE},
                     f"BatchDecodeWithPagedKVCacheWrapper over FlashInfer's layout (HND pages of {PAGE}, a copy of the "
                     "cache: adopting it means another cache layout), planned on the host before")
        except Exception as err:  # noqa: BLE001
            run.rows.append({"family": "attention", "shape": name, "batch": batch, "impl": impl, **extra,
                             "error": f"plan: {type(err).__name__}: {err}"[:400]})
    del native


PAGE = 16  # FlashInfer's usual page size


def host_us(fn, repeats: int = 5) -> float:
    """Median host microseconds of ``fn()`` (FlashInfer's plan: CPU work before a step)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def pages(keys, values, page: int):
    """``[rows, kv_heads, slots, dim]`` keys and values as FlashInfer's ``HND`` pages ``[rows * slots / page,
    kv_heads, page, dim]`` (row ``b``'s pages consecutive)."""
    b, h, n, d = keys.shape

    def paged(x):
        return x.view(b, h, n // page, page, d).permute(0, 2, 1, 3, 4).reshape(b * n // page, h, page, d)

    return paged(keys), paged(values)


def native_wrapper(run: Run, fi, s: Shape, batch: int, length: int, tensor_cores: bool):
    """A CUDA-graph wrapper over ``batch`` rows of ``length / PAGE`` pages each, and its plan (planned once)."""
    torch = run.torch
    per_row = length // PAGE
    indptr = torch.arange(batch + 1, dtype=torch.int32) * per_row  # on the host, as PagedDecode plans
    indices = torch.arange(batch * per_row, dtype=torch.int32)
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    dev = run.device
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=dev), "HND", use_cuda_graph=True,
        use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr.to(dev), paged_kv_indices_buffer=indices.to(dev),
        paged_kv_last_page_len_buffer=last.to(dev))

    def plan():
        wrapper.plan(indptr, indices, last, s.heads, s.kv_heads, s.head_dim, PAGE, q_data_type=run.dtype,
                     kv_data_type=run.dtype, sm_scale=s.head_dim ** -0.5)

    plan()
    return wrapper, plan


def pick(out, rows):
    return [out[b] for b in rows]


# ---- add + RMSNorm -----------------------------------------------------------------------------------------
def add_norm(run: Run, fi, name: str, s: Shape, batch: int) -> None:
    torch = run.torch
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from hf_rstitch.fast.patches.add_norm import _add_norm

    dev = run.device
    norm = Qwen2RMSNorm(s.hidden, eps=s.eps).to(dev, run.dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    residual = torch.randn(batch, 1, s.hidden, dtype=run.dtype, device=dev)
    h = torch.randn_like(residual)
    total = (residual.float() + h.float()).to(run.dtype).float()
    ref = [total, total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + s.eps) * norm.weight.float()]
    piece = torch.compile(_add_norm, dynamic=True, fullgraph=True) if dev == "cuda" else _add_norm
    with torch.no_grad():
        run.case("add_norm", name, batch, "ours: compiled add + RMSNorm", lambda: list(piece(norm, residual, h)),
                 ref, includes="residual + h (bf16), then the model's RMSNorm: one compiled kernel")
        run.case("add_norm", name, batch, "transformers eager add + RMSNorm",
                 lambda: list(_add_norm(norm, residual, h)), ref, includes="eager ops")
        if fi is None:
            return
        x2, r2 = h[:, 0].clone(), residual[:, 0].clone()

        def fused():  # in place: fresh copies so the check sees one add (the timing's repeats accumulate)
            x2.copy_(h[:, 0])
            r2.copy_(residual[:, 0])
            fi.norm.fused_add_rmsnorm(x2, r2, norm.weight, s.eps)
            return [r2[:, None], x2[:, None]]

        run.case("add_norm", name, batch, "flashinfer: fused_add_rmsnorm", fused, ref,
                 includes="in place, plus two copies to restore its inputs (~2 small kernels)")
        run.case("add_norm", name, batch, "flashinfer: fused_add_rmsnorm (alone)",
                 lambda: fi.norm.fused_add_rmsnorm(x2, r2, norm.weight, s.eps) or [r2[:, None], x2[:, None]],
                 None, includes="in place, repeated on its own outputs (timing only)")


# ---- rotary ------------------------------------------------------------------------------------------------
def rope(run: Run, fi, name: str, s: Shape, batch: int, length: int = 4096) -> None:
    torch = run.torch
    from hf_rstitch.fast.kernels.rope_store import rope_store, rotate_qk

    dev, d = run.device, s.head_dim
    positions = torch.randint(0, length, (batch,), device=dev)
    inv = 1.0 / (s.theta ** (torch.arange(0, d, 2, device=dev).float() / d))
    table = torch.arange(length, device=dev).float()[:, None] * inv[None]  # [L, D/2]
    cos_sin = torch.cat([table.cos(), table.sin()], -1).contiguous()  # flashinfer's float32 cache
    emb = torch.cat([table, table], -1)[positions][:, None]  # [b, 1, D]
    cos, sin = emb.cos().to(run.dtype), emb.sin().to(run.dtype)  # what transformers hands a layer
    qf = torch.randn(batch, 1, s.heads, d, dtype=run.dtype, device=dev)  # [b, s, H, D] as projected
    kf = torch.randn(batch, 1, s.kv_heads, d, dtype=run.dtype, device=dev)
    v = torch.randn_like(kf)
    q, k = qf.transpose(1, 2), kf.transpose(1, 2)  # [b, H, 1, D] views, as a layer passes them

    def rotated(x):  # float32 reference: x * cos + rotate_half(x) * sin
        c, sn = emb.cos()[:, None], emb.sin()[:, None]
        xf = x.float()
        return xf * c + torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], -1) * sn

    ref = [rotated(q), rotated(k)]
    run.case("rope", name, batch, "ours: rotate_qk", lambda: list(rotate_qk(q, k, cos, sin)), ref,
             includes="q and k rotated out of place, one launch")
    keys = torch.zeros(batch, s.kv_heads, length, d, dtype=run.dtype, device=dev)
    values = torch.zeros_like(keys)
    slot = positions[:1]  # one slot for all rows (the engine's rows share the write offset)
    q_out = torch.empty(batch, s.heads, 1, d, dtype=run.dtype, device=dev)
    pos0 = int(slot[0])
    store_ref = [ref[0], ref[1][:, :, 0], v.transpose(1, 2)[:, :, 0].float()]  # q, the stored key and value

    def ours_store():
        rope_store(q, k, v.transpose(1, 2), cos, sin, slot, q_out, keys, values)
        return [q_out, keys[:, :, pos0], values[:, :, pos0]]

    run.case("rope", name, batch, "ours: rope_store", ours_store, store_ref,
             includes="q, k rotated and k, v written into the static cache: one launch")
    if fi is None:
        return
    pos32 = positions.to(torch.int32)
    run.case("rope", name, batch, "flashinfer: apply_rope_with_cos_sin_cache",
             lambda: [x.view(batch, -1, 1, d) for x in fi.rope.apply_rope_with_cos_sin_cache(
                 pos32, qf.reshape(batch, -1), kf.reshape(batch, -1), d, cos_sin)], ref,
             includes="q and k rotated out of place (float32 cos/sin cache), one launch")
    qi, ki = qf.reshape(batch, -1).clone(), kf.reshape(batch, -1).clone()
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    last = torch.full((batch,), pos0 + 1, dtype=torch.int32, device=dev)
    at = torch.full((batch,), pos0, dtype=torch.int32, device=dev)

    def fi_store():
        fi.rope.apply_rope_with_cos_sin_cache_inplace(pos32, qi, ki, d, cos_sin)
        fi.page.append_paged_kv_cache(ki.view(batch, -1, d), v[:, 0], indptr[:-1], at, (keys, values), indptr[:-1],
                                      indptr, last, kv_layout="HND")
        return [qi.view(batch, -1, 1, d), keys[:, :, pos0], values[:, :, pos0]]

    def fi_store_checked():
        qi.copy_(qf.reshape(batch, -1))
        ki.copy_(kf.reshape(batch, -1))
        return fi_store()

    row = len(run.rows)
    run.case("rope", name, batch, "flashinfer: rope inplace + append_paged_kv_cache", fi_store_checked, store_ref,
             includes="rotate in place, then write k, v into the same cache as pages: two launches (+2 copies "
                      "restoring q, k; see the next row for the two launches alone)")
    if "error" not in run.rows[row]:
        run.case("rope", name, batch, "flashinfer: rope inplace + append_paged_kv_cache (alone)", fi_store,
                 None, includes="the two launches alone (timing only)")


# ---- gated MLP ---------------------------------------------------------------------------------------------
def gated(run: Run, fi, name: str, s: Shape, batch: int) -> None:
    torch = run.torch
    import torch.nn.functional as F

    from hf_rstitch.fast.kernels import gated as ours
    from hf_rstitch.fast.kernels.gemv import MAX_ROWS, WIDE_ROWS

    dev, n = run.device, s.intermediate
    gate = torch.randn(n, s.hidden, dtype=run.dtype, device=dev) * s.hidden ** -0.5
    up = torch.randn_like(gate)
    both = torch.cat([gate, up]).contiguous()  # [2I, H]: what a fused gate_up projection holds
    x = torch.randn(batch, s.hidden, dtype=run.dtype, device=dev)
    ref = F.silu(x.float() @ gate.float().T) * (x.float() @ up.float().T)
    tier = 1 if batch == 1 else MAX_ROWS if batch <= MAX_ROWS else WIDE_ROWS
    cfg = ours.tune(gate, up, ours.TIER_CANDIDATES[tier]) if batch <= WIDE_ROWS else None
    if cfg is not None:
        run.case("gated", name, batch, "ours: gated GEMV (tuned)", lambda: ours.launch(x, gate, up, cfg), ref,
                 {"config": asdict(cfg)}, "gate and up products + SiLU product, one kernel (two with split sums)")
    else:
        run.skipped.append(f"gated {name} B={batch}: our tuner keeps cuBLAS + the eager product at this tier")
    run.case("gated", name, batch, "cuBLAS gate, up + eager SiLU product", lambda: ours.reference(x, gate, up), ref,
             includes="two cuBLAS GEMMs + silu, mul (what ours falls back to)")
    act = torch.compile(lambda y: F.silu(y[..., :n]) * y[..., n:], dynamic=True, fullgraph=True) \
        if dev == "cuda" else (lambda y: F.silu(y[..., :n]) * y[..., n:])
    run.case("gated", name, batch, "cuBLAS gate_up + compiled SiLU product", lambda: act(F.linear(x, both)), ref,
             includes="one cuBLAS GEMM over the concatenated weight + one compiled kernel")
    y = F.linear(x, both)
    act_ref = F.silu(y.float()[..., :n]) * y.float()[..., n:]
    run.case("activation", name, batch, "compiled SiLU product", lambda: act(y), act_ref,
             includes="activation alone, [b, 2I] -> [b, I]")
    if fi is None:
        return
    run.case("gated", name, batch, "cuBLAS gate_up + flashinfer silu_and_mul",
             lambda: fi.activation.silu_and_mul(F.linear(x, both)), ref,
             includes="one cuBLAS GEMM over the concatenated weight + flashinfer's activation")
    run.case("activation", name, batch, "flashinfer: silu_and_mul", lambda: fi.activation.silu_and_mul(y), act_ref,
             includes="activation alone, [b, 2I] -> [b, I]")


# ---- the run -----------------------------------------------------------------------------------------------
def warm_flashinfer(run: Run, fi, families) -> None:
    """Build FlashInfer's JIT modules the run needs at once, in threads (each build is an nvcc process): tiny calls
    of each; their seconds go to ``first_calls`` as ``jit/<name>``, the wall time of all as ``jit_wall_s``."""
    from concurrent.futures import ThreadPoolExecutor

    torch, dev, dt = run.torch, run.device, run.dtype
    x = lambda *shape: torch.randn(*shape, dtype=dt, device=dev)  # noqa: E731
    pos = torch.zeros(1, dtype=torch.int32, device=dev)
    one = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    table = torch.zeros(16, 128, dtype=torch.float32, device=dev)
    kv = (x(1, 2, 16, 128), x(1, 2, 16, 128))
    calls = {
        "add_norm": {"norm": lambda: fi.norm.fused_add_rmsnorm(x(1, 128), x(1, 128), x(128), 1e-6)},
        "rope": {"rope": lambda: fi.rope.apply_rope_with_cos_sin_cache(pos, x(1, 256), x(1, 256), 128, table),
                 "page": lambda: fi.page.append_paged_kv_cache(x(1, 2, 128), x(1, 2, 128), one[:1], pos, kv, one[:1],
                                                               one, one[1:], kv_layout="HND")},
        "gated": {"activation": lambda: fi.activation.silu_and_mul(x(1, 256))},
        "attention": {"single_decode": lambda: fi.single_decode_with_kv_cache(x(4, 128), kv[0][0], kv[1][0],
                                                                              kv_layout="HND")},
    }
    todo = {name: fn for fam in families for name, fn in calls.get(fam, {}).items()}

    def build(item):
        name, fn = item
        t0 = time.perf_counter()
        try:
            fn()
            run.sync()
            return name, time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001  (the case will build it, or record why not)
            return name, f"{type(err).__name__}: {err}"[:200]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        for name, took in pool.map(build, todo.items()):
            run.first_calls[f"jit/{name}"] = took
    run.first_calls["jit_wall_s"] = time.perf_counter() - t0
    print(json.dumps({"jit": run.first_calls}, default=str), flush=True)


def merge(doc: dict, path: str | None, families) -> None:
    """Rows and first calls of an earlier result (same card) for the families this run did not time."""
    if not path or not Path(path).exists():
        return
    old = json.loads(Path(path).read_text())
    if old.get("device") != doc["device"]:
        doc["skipped"].append(f"--merge {path}: measured on {old.get('device')}, not merged")
        return
    ran = set(families) | ({"activation"} if "gated" in families else set())
    kept = [{**r, "from_run": old.get("date")} for r in old.get("rows", []) if r["family"] not in ran]
    doc["rows"][:0] = kept
    for k, v in old.get("first_calls", {}).items():
        doc["first_calls"].setdefault(k, v)
    doc["merged_from"] = {"path": str(path), "date": old.get("date"), "rows": len(kept)}


def winners(rows: list[dict]) -> list[dict]:
    """Per (family, shape, batch, kv_len): our fastest agreeing row against FlashInfer's fastest agreeing row."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        if "us" not in r or not r.get("agree") or "(alone)" in r["impl"]:
            continue
        side = "ours" if r["impl"].startswith("ours") else "flashinfer" if "flashinfer" in r["impl"] else None
        if side is None:
            continue
        g = groups.setdefault((r["family"], r["shape"], r["batch"], r.get("kv_len")), {})
        if side not in g or r["us"] < g[side]["us"]:
            g[side] = r
    out = []
    for (family, shape, batch, kv_len), g in groups.items():
        row = {"family": family, "shape": shape, "batch": batch, "kv_len": kv_len,
               **{f"{side}_us": g[side]["us"] for side in g}, **{f"{side}_impl": g[side]["impl"] for side in g}}
        if "ours" in g and "flashinfer" in g:
            row["flashinfer_over_ours"] = g["flashinfer"]["us"] / g["ours"]["us"]  # > 1: ours faster
        out.append(row)
    return out


def markdown(doc: dict) -> str:
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [f"# Our kernels against FlashInfer's: bf16, one decode token a row, {doc['device']}", "",
             f"torch {doc['versions']['torch']}, triton {doc['versions'].get('triton')}, flashinfer "
             f"{doc['versions'].get('flashinfer') or 'absent (' + doc.get('flashinfer_reason', '') + ')'}, "
             f"{doc['date']}. Microseconds a call, CUDA graph replays (`triton.testing.do_bench_cudagraph`); every "
             "output checked against a float32 reference first. flashinfer / ours > 1: ours is faster.", "",
             "| family | shape | B | KV len | ours (us) | FlashInfer (us) | FlashInfer / ours | FlashInfer's best |",
             "|---|---|---|---|---|---|---|---|"]
    for w in doc["summary"]:
        lines.append(f"| {w['family']} | {w['shape']} | {w['batch']} | {w['kv_len'] or '-'} | {f(w.get('ours_us'))} | "
                     f"{f(w.get('flashinfer_us'))} | {f(w.get('flashinfer_over_ours'), 2)} | "
                     f"{w.get('flashinfer_impl', '-').replace('flashinfer: ', '')} |")
    lines += ["", "Every row (what each includes, errors):", "",
              "| family | shape | B | KV len | implementation | us | max rel. error | includes |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        took = f(r.get("us")) if "us" in r else "error: " + r.get("error", "?")[:100].replace("|", "/")
        lines.append(f"| {r['family']} | {r['shape']} | {r['batch']} | {r.get('kv_len') or '-'} | {r['impl']} | {took} | "
                     f"{f(r.get('max_err'), 4)} | {r.get('includes', '')} |")
    lines += ["", "First calls (s; FlashInfer's JIT builds, Triton's compiles): " +
              ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} ({v})" for k, v in doc["first_calls"].items())]
    if doc["skipped"]:
        lines += ["", "Skipped: " + "; ".join(doc["skipped"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES) + list(TINY))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--kv-lens", nargs="+", type=int, default=[512, 4096, 32768])
    ap.add_argument("--rep-ms", type=int, default=25, help="milliseconds of replays per timing")
    ap.add_argument("--budget-s", type=float, default=190, help="no new case starts past this many seconds")
    ap.add_argument("--merge", metavar="JSON", help="an earlier result on the same card: its rows of the families "
                    "this run does not time are kept")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny shapes on CPU, our kernels under Triton's "
                    "interpreter, FlashInfer absent: checks the script, times nothing")
    args = ap.parse_args()
    if args.dry_run_cpu:
        args.shapes, args.batches, args.kv_lens = ["tiny"], [1, 2], [32]
    import torch

    run = Run(args)
    fi = None if args.dry_run_cpu else flashinfer()
    env = lab.environment([run.device])
    versions = {k: env[k] for k in ("torch", "transformers", "python")}
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError:
        pass
    versions["flashinfer"] = getattr(fi, "__version__", None)
    doc = {"device": env["devices"][0] if run.device == "cuda" else "cpu dry run", "versions": versions,
           "date": env["date"], "args": vars(args), "flashinfer_reason": flashinfer.reason or
           ("--dry-run-cpu" if args.dry_run_cpu else ""), "rows": run.rows, "first_calls": run.first_calls,
           "skipped": run.skipped}
    shapes = {**SHAPES, **TINY}
    cases = [(fam, name, b, L) for fam in args.families for name in args.shapes for b in args.batches
             for L in (args.kv_lens if fam == "attention" else [None])]
    if fi is not None:
        warm_flashinfer(run, fi, args.families)
    with torch.no_grad():
        for fam, name, b, L in cases:
            if run.left() < 5:
                run.skipped.append(f"{fam} {name} B={b}{f' L={L}' if L else ''}: time budget")
                continue
            s = shapes[name]
            if fam == "attention":
                attention(run, fi, name, s, b, L)
            else:
                {"add_norm": add_norm, "rope": rope, "gated": gated}[fam](run, fi, name, s, b)
            torch.cuda.empty_cache() if run.device == "cuda" else None
    merge(doc, args.merge, args.families)
    doc["summary"] = winners(run.rows)
    gpu = re.sub(r"[^a-z0-9]+", "_", doc["device"].lower()).strip("_")
    lab.write_result(Path(args.out_dir) / f"kernels_vs_flashinfer_{gpu}", doc, markdown(doc))
    print(markdown(doc))
    print(json.dumps({"device": doc["device"], "flashinfer": versions["flashinfer"],
                      "summary": [{k: w.get(k) for k in ("family", "shape", "batch", "kv_len", "flashinfer_over_ours")}
                                  for w in doc["summary"]]}))


if __name__ == "__main__":
    main()
