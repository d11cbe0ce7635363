"""Attention over a static KV cache that reads only the slots written so far (Triton, split-K).

Why: :func:`~hf_rstitch.fast.static_kv.static_attention` reads every slot of the static cache on
every step (a CUDA graph fixes the shapes), so its cost is set by the capacity, not by the
sequence: at batch 64 on Qwen2-7B with 3072 slots that is 11 GB a step against 15 GB of weights,
and at batch 1 its dozen small kernels per layer cost more than the bytes they read. Here one
kernel reads the slots ``[0, pos + q)`` (``pos`` is the cache's write offset, a device scalar, so a
captured graph reads the right length on every replay) in independent chunks ("splits", as in
flash-decoding), each split an equal share of the slots written so far (the grid is fixed when a graph
is captured, the split length is not: a short sequence runs as many programs as a long one, each over
fewer slots); a second kernel combines the splits (or, with :data:`COMBINE_IN_SPLIT`, the split program that
finishes last, counting finished splits in a kept ticket buffer: one kernel a layer, not two). Where the rows alone give the device a wave of
programs (large batches) there is one split: the kernel walks every written slot in a pipelined loop
and writes the output itself, with no partial results and no combine. Per row, slots left of the
row's padding count (``pad[b]``) are masked, as is everything right of each query's own slot.

Sliding windows, soft-capping and sinks (:mod:`hf_rstitch.fast.windows`): a layer with window ``W`` reads slots
``[pos - W + 1, pos + q)`` only (the splits share that span) and masks, per query ``i``, the slots at or
before ``pos + i - W``; ``softcap`` caps the scaled scores (``softcap * tanh(s / softcap)``); gpt-oss's sink
logit of each head joins the softmax's denominator where the output is normalised.

The plan (:func:`_plan`): one split from ~one wave of programs; below that, up to 16 splits of 64-slot blocks
(measured: ``benchmarks/results/tuning_attention_nvidia_h200.md``).

Same arithmetic as the eager attention where it matters: scores and softmax in float32 (eager
attention rounds the scores to the model's dtype first), probabilities rounded to the values'
dtype before the weighted sum. float32 models run the products in IEEE float32 (no TF32).

What it does not do: head sizes that are not a power of two >= 16 (:func:`supported` says so and
the caller keeps the matmul attention), dropout.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .attention_support import runs_for, supported
from .triton_support import _triton, interpreted, next_pow2, pdl, start
from ..windows import NO_WINDOW, call_window
from .triton_support import sm_count as _sm_count  # a module name the tests can patch

FILL = 2  # programs per SM the plan aims for with several splits
# several splits: at most MAX_SPLITS a (row, KV head), SPLIT_BLOCK_N slots an inner step in SPLIT_STAGES pipeline
# stages. On an H200 (B = 1..8; 2, 4 and 8 KV heads; 1024 and 3000 slots written) 16 splits of 64-slot steps in 3
# stages beat 64 splits of 128-slot steps in 2 in all 24 cases, by 1-28 % (results/tuning_attention_nvidia_h200.md)
MAX_SPLITS = 16
SPLIT_BLOCK_N, SPLIT_STAGES = 64, 3
# from this many waves of programs (batch x KV heads x row blocks over the SMs) one split: the split kernel
# writes the output itself and no combine runs
ONE_SPLIT = 0.9
ONE_BLOCK_N, ONE_STAGES = 64, 3  # one split: a long loop, a deeper pipeline
WIDE_BLOCK_N = 64  # slots an inner step for heads wider than 128 (two stages of 64 x 256 bf16 keys and values)
WARPS = 4  # warps a split-kernel program
# what the splits share: "written" (the slots written so far) or "capacity" (every slot of the cache, the
# earlier plan, kept to measure against: early in a long generation most of its splits have nothing to read)
SPLIT_BASIS = "written"


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def _combine(acc_ptr, ml_ptr, o_ptr, sink_ptr, b, kvh, m, real, g, i, d, span, length, first, rows_padded,
                 so_b, so_q, so_h, GROUP, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_S: tl.constexpr, CHUNK_S: tl.constexpr, SINKS: tl.constexpr):
        # out[b, i, kvh * GROUP + g, d] = sum over splits of acc * exp(m - max) / sum of l * exp(m - max), for the
        # BLOCK_D columns d. Every split's (max, sum) is read in one [BLOCK_S, BLOCK_M] tile and the partial
        # outputs CHUNK_S splits at a time: a few dependent loads, not two per split. Loads bypass L1 (".cg"):
        # other programs wrote the partials (the split kernel's last program combines them itself)
        used = (span + length - 1) // length
        s = tl.arange(0, BLOCK_S)
        at = (first + s)[:, None] * rows_padded + m[None, :]  # [S, BM]
        ok = (s < used)[:, None] & real[None, :]  # padding rows were never written
        maxes = tl.load(ml_ptr + 2 * at, mask=ok, other=float("-inf"), cache_modifier=".cg")
        m_all = tl.max(maxes, 0)
        if SINKS:  # the head's sink logit joins the denominator
            sink = tl.load(sink_ptr + kvh * GROUP + g, mask=real, other=0.0).to(tl.float32)
            m_all = tl.maximum(m_all, sink)
        m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
        total = tl.sum(tl.exp(maxes - m_safe[None, :]) * tl.load(ml_ptr + 2 * at + 1, mask=ok, other=0.0,
                                                                 cache_modifier=".cg"), 0)
        if SINKS:
            total += tl.exp(sink - m_safe)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for c in range(0, used, CHUNK_S):
            sc = c + tl.arange(0, CHUNK_S)
            at_c = (first + sc)[:, None] * rows_padded + m[None, :]  # [C, BM]
            ok_c = (sc < used)[:, None] & real[None, :]
            w = tl.exp(tl.load(ml_ptr + 2 * at_c, mask=ok_c, other=float("-inf"), cache_modifier=".cg")
                       - m_safe[None, :])
            part = tl.load(acc_ptr + at_c[:, :, None] * HEAD_DIM + d[None, None, :], mask=ok_c[:, :, None],
                           other=0.0, cache_modifier=".cg")  # [C, BM, BD]
            acc += tl.sum(w[:, :, None] * part, 0)
        y = acc / tl.where(real, total, 1.0)[:, None]  # padding rows: nothing to divide (and not stored)
        tl.store(o_ptr + b * so_b + i[:, None] * so_q + (kvh * GROUP + g)[:, None] * so_h + d[None, :],
                 y.to(o_ptr.dtype.element_ty), mask=real[:, None])

    # Triton resolves the names a kernel calls in its module's globals (the interpreter too), not in a closure
    globals()["_combine"], globals()["tl"] = _combine, tl

    @triton.jit
    def split_kernel(q_ptr, k_ptr, v_ptr, acc_ptr, ml_ptr, o_ptr, pad_ptr, pos_ptr, sink_ptr, table_ptr, cnt_ptr, scale,
                     softcap, sq_b, sq_h, sq_q, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_q, so_h, st_b, n_splits,
                     Q_LEN, GROUP, KV_HEADS, BASIS, WINDOW, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr, PDL: tl.constexpr,
                     CAP: tl.constexpr, SINKS: tl.constexpr, PAGE: tl.constexpr, LAST_COMBINES: tl.constexpr,
                     CHUNK_S: tl.constexpr, BLOCK_S: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # one program: rows [mb * BLOCK_M, +BLOCK_M) of (group head, query) for one KV head of one batch row,
        # slots [lo + split * length, +length) -> partial (acc [BLOCK_M, D], max, sum), all float32, where lo is
        # the first slot the layer's window lets any query of this call see (0 without a window) and length the
        # share per split of the slots from there (split_length). Only the head size and block sizes are
        # compile-time constants: one compiled kernel serves every batch, catch-up length and sequence length.
        split, hm, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        kvh, mb = hm % KV_HEADS, hm // KV_HEADS
        pos = tl.load(pos_ptr)
        total = pos + Q_LEN  # slots written, this call's included
        lo = tl.maximum(pos - WINDOW + 1, 0)
        shared = tl.maximum(total - lo, BASIS)  # BASIS: 0, or the capacity (>= every written length)
        length = ((shared + n_splits - 1) // n_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # as split_length()
        start = lo + split * length
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # row = g * Q_LEN + i
        real = m < GROUP * Q_LEN
        g, i = m // Q_LEN, m % Q_LEN
        d = tl.arange(0, HEAD_DIM)
        rows_padded = tl.num_programs(1) // KV_HEADS * BLOCK_M
        out = ((b * KV_HEADS + kvh) * n_splits + split) * rows_padded + m
        if start < total:  # splits past the written slots (a few, when they are short) do nothing
            q = tl.load(q_ptr + b * sq_b + (kvh * GROUP + g)[:, None] * sq_h + i[:, None] * sq_q + d[None, :],
                        mask=real[:, None], other=0.0)  # [BM, D]
            mine = pos + i  # each query's own slot
            pad = tl.load(pad_ptr + b)
            m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            l_i = tl.zeros((BLOCK_M,), tl.float32)
            acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
            stop = tl.minimum(start + length, total)
            for n0 in range(start, stop, BLOCK_N):  # a for loop, so Triton pipelines its loads (num_stages)
                cols = n0 + tl.arange(0, BLOCK_N)
                inside = cols < stop
                if PAGE > 0:  # paged: slot j of row b is its token j - pad in block table[b, token // PAGE]
                    token = tl.maximum(cols - pad, 0)  # slots left of the padding read token 0 (masked below)
                    block = tl.load(table_ptr + b * st_b + token // PAGE, mask=inside, other=0).to(tl.int64)
                    k_at = block * sk_b + (token % PAGE) * sk_s
                    v_at = block * sv_b + (token % PAGE) * sv_s
                else:
                    k_at = b * sk_b + cols * sk_s
                    v_at = b * sv_b + cols * sv_s
                k = tl.load(k_ptr + kvh * sk_h + k_at[:, None] + d[None, :], mask=inside[:, None],
                            other=0.0)  # [BN, D]
                if IEEE:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = s * scale  # [BM, BN]
                if CAP:  # softcap * tanh(s / softcap), tanh from one exp of -2|x| (no overflow)
                    t = tl.exp(-2.0 * tl.abs(s / softcap))
                    s = tl.where(s < 0, -1.0, 1.0) * softcap * (1.0 - t) / (1.0 + t)
                see = (cols[None, :] <= mine[:, None]) & ((cols[None, :] >= pad) | (cols[None, :] == mine[:, None]))
                see = see & (cols[None, :] > mine[:, None] - WINDOW)
                s = tl.where(see & inside[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(v_ptr + kvh * sv_h + v_at[:, None] + d[None, :], mask=inside[:, None], other=0.0)
                if IEEE:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            if DIRECT:  # one split: the output itself (each real row sees at least its own slot, so l_i > 0)
                if SINKS:  # the head's sink logit joins the denominator
                    sink = tl.load(sink_ptr + kvh * GROUP + g, mask=real, other=0.0).to(tl.float32)
                    m_f = tl.maximum(m_i, sink)
                    keep = tl.exp(m_i - m_f)
                    acc = acc * keep[:, None]
                    l_i = l_i * keep + tl.exp(sink - m_f)
                y = acc / tl.where(real, l_i, 1.0)[:, None]
                tl.store(o_ptr + b * so_b + i[:, None] * so_q + (kvh * GROUP + g)[:, None] * so_h + d[None, :],
                         y.to(o_ptr.dtype.element_ty), mask=real[:, None])
            else:  # only the real rows: with a group of 7 query heads a block of 16 is more than half padding
                tl.store(acc_ptr + out[:, None] * HEAD_DIM + d[None, :], acc, mask=real[:, None])
                tl.store(ml_ptr + 2 * out, m_i, mask=real)
                tl.store(ml_ptr + 2 * out + 1, l_i, mask=real)
        if LAST_COMBINES:  # the split that finishes last (of those with slots or not) combines them all: no 2nd kernel
            tl.debug_barrier()  # every thread's partial stores come before the ticket (released with it)
            at_cnt = cnt_ptr + b * tl.num_programs(1) + hm
            ticket = tl.atomic_add(at_cnt, 1, sem="acq_rel")
            if ticket == n_splits - 1:
                _combine(acc_ptr, ml_ptr, o_ptr, sink_ptr, b, kvh, m, real, g, i, d, total - lo, length,
                         (b * KV_HEADS + kvh) * n_splits, rows_padded, so_b, so_q, so_h, GROUP, HEAD_DIM, BLOCK_M,
                         HEAD_DIM, BLOCK_S, CHUNK_S, SINKS)
                tl.atomic_xchg(at_cnt, 0)  # ready for the next call (or graph replay)

    @triton.jit
    def combine_kernel(acc_ptr, ml_ptr, o_ptr, pos_ptr, sink_ptr, so_b, so_q, so_h, n_splits, Q_LEN, GROUP, KV_HEADS,
                       BASIS, WINDOW, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK_S: tl.constexpr, PDL: tl.constexpr,
                       SINKS: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # out[b, i, kvh * GROUP + g, d] = sum over splits of acc * exp(m - max) / sum of l * exp(m - max), for the
        # BLOCK_D columns d of this program. Every split's (max, sum) is read in one [BLOCK_S, BLOCK_M] tile and
        # the partial outputs CHUNK_S splits at a time: a few dependent loads, not two per split.
        hm, b, db = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        kvh, mb = hm % KV_HEADS, hm // KV_HEADS
        rows_padded = tl.num_programs(0) // KV_HEADS * BLOCK_M
        m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        real = m < GROUP * Q_LEN
        g, i = m // Q_LEN, m % Q_LEN
        d = db * BLOCK_D + tl.arange(0, BLOCK_D)
        pos = tl.load(pos_ptr)
        span = pos + Q_LEN - tl.maximum(pos - WINDOW + 1, 0)  # the slots the splits shared (as split_kernel)
        shared = tl.maximum(span, BASIS)
        length = ((shared + n_splits - 1) // n_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # as split_length()
        _combine(acc_ptr, ml_ptr, o_ptr, sink_ptr, b, kvh, m, real, g, i, d, span, length,
                 (b * KV_HEADS + kvh) * n_splits, rows_padded, so_b, so_q, so_h, GROUP, HEAD_DIM, BLOCK_M, BLOCK_D,
                 BLOCK_S, CHUNK_S, SINKS)

    return split_kernel, combine_kernel


class Plan(NamedTuple):
    block_m: int  # query rows (group heads x queries) a program
    row_blocks: int
    splits: int
    block_n: int  # slots an inner step
    stages: int


def _plan(batch: int, kv_heads: int, rows: int, slots: int, sms: int, dim: int = 128) -> Plan:
    """One split (:data:`ONE_BLOCK_N`, :data:`ONE_STAGES`) where the rows alone make :data:`ONE_SPLIT`
    waves of programs over ``sms``; else enough splits of :data:`SPLIT_BLOCK_N` slots to fill ``sms``
    :data:`FILL` times over, no more than :data:`MAX_SPLITS` nor more than the cache's ``slots`` fill.
    The kernels share the slots written so far among the splits (:func:`split_length`), so every split
    works at any sequence length once it holds a block a split. Heads wider than 128 (Gemma's 256) take
    :data:`WIDE_BLOCK_N`-slot blocks in two stages: a stage's key and value tiles must fit shared memory."""
    plan = _plan_rows(batch, kv_heads, rows, slots, sms)
    if dim > 128:
        return plan._replace(block_n=WIDE_BLOCK_N, stages=2)
    return plan


def _plan_rows(batch: int, kv_heads: int, rows: int, slots: int, sms: int) -> Plan:
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    row_blocks = -(-rows // block_m)
    programs = batch * kv_heads * row_blocks
    if programs >= ONE_SPLIT * sms:
        return Plan(block_m, row_blocks, 1, ONE_BLOCK_N, ONE_STAGES)
    want = max(1, -(-FILL * sms // programs))
    splits = max(1, min(MAX_SPLITS, want, -(-slots // SPLIT_BLOCK_N)))
    return Plan(block_m, row_blocks, splits, SPLIT_BLOCK_N, SPLIT_STAGES)


def split_length(total: int, n_splits: int, block_n: int) -> int:
    """Slots per split when ``total`` are written (the kernels compute the same on the device)."""
    share = -(-total // n_splits)
    return -(-share // block_n) * block_n


@torch.library.custom_op("hf_rstitch::decode_attention", mutates_args=())
def decode_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pos: torch.Tensor,
                        pad: torch.Tensor, scale: float, window: int = NO_WINDOW, softcap: float = 0.0,
                        sinks: torch.Tensor | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
    return _launch(query, key, value, pos, pad, scale, window, softcap, sinks, table)


def _launch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pos: torch.Tensor, pad: torch.Tensor,
            scale: float, window: int = NO_WINDOW, softcap: float = 0.0,
            sinks: torch.Tensor | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernels: ``window`` slots a query (:data:`NO_WINDOW`: all), ``softcap`` (0: none), ``sinks``
    ``[H]`` (gpt-oss's sink logit of each head, or None). ``table``: a paged cache's ``[b, width]`` int32 block
    table (:mod:`.paged_kv`), ``key`` / ``value`` then a pool layer ``[blocks, H_kv, BLOCK, D]``."""
    batch, heads, q_len, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    page = 0
    if table is not None:
        page, slots = key.shape[2], table.shape[1] * key.shape[2]
    group = heads // kv_heads
    block_m, row_blocks, n_splits, block_n, stages = _plan(batch, kv_heads, group * q_len, slots,
                                                          _sm_count(query.device), dim)
    rows_padded = row_blocks * block_m
    partials = batch * kv_heads * n_splits * rows_padded if n_splits > 1 else 1  # one split: none kept
    acc = torch.empty(partials, dim, dtype=torch.float32, device=query.device)
    ml = torch.empty(partials * 2, dtype=torch.float32, device=query.device)
    out = torch.empty(batch, q_len, heads, dim, dtype=query.dtype, device=query.device)  # [b, q, H, D]
    split_kernel, combine_kernel = _kernels()
    if SPLIT_BASIS not in ("written", "capacity"):
        raise ValueError(f"decode_attention.SPLIT_BASIS must be 'written' or 'capacity', got {SPLIT_BASIS!r}")
    basis = 0 if SPLIT_BASIS == "written" else slots
    ieee = query.dtype == torch.float32
    on = pdl(query.device, batch * q_len)
    sink = ml if sinks is None else sinks  # a pointer the kernels never read without SINKS
    tickets = _tickets(query.device, batch * kv_heads * row_blocks) if n_splits > 1 else None
    start(split_kernel, (n_splits, kv_heads * row_blocks, batch))(
        query, key, value, acc, ml, out, pad, pos, sink, pad if table is None else table,
        ml if tickets is None else tickets, scale, float(softcap or 1.0), query.stride(0), query.stride(1),
        query.stride(2), key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1),
        value.stride(2), out.stride(0), out.stride(1), out.stride(2), 0 if table is None else table.stride(0),
        n_splits, q_len, group, kv_heads, basis, window, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n,
        IEEE=ieee or interpreted(), DIRECT=n_splits == 1, num_warps=WARPS, num_stages=stages, PDL=on, launch_pdl=on,
        CAP=bool(softcap), SINKS=sinks is not None, PAGE=page, LAST_COMBINES=tickets is not None,
        CHUNK_S=max(1, 4096 // (block_m * dim)), BLOCK_S=max(16, next_pow2(n_splits)),
    )
    if n_splits == 1 or tickets is not None:
        return out
    block_d = min(dim, 32)
    start(combine_kernel, (kv_heads * row_blocks, batch, dim // block_d))(
        acc, ml, out, pos, sink, out.stride(0), out.stride(1), out.stride(2), n_splits, q_len, group, kv_heads,
        basis, window, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        BLOCK_S=max(16, next_pow2(n_splits)), CHUNK_S=128 // block_m, num_warps=4, PDL=on, launch_pdl=on,
        SINKS=sinks is not None,
    )
    return out


# With several splits the split kernel's last program of each (row, KV head, row block) combines the splits itself
# (LAST_COMBINES: one kernel a layer, not two), counting finished splits in a kept ticket buffer (int32, zero between
# calls: the combining program resets its ticket). Off by default: correct on CUDA (GPU tests), but one program then
# reads every split's partials alone, and an A/B on one H100 had every step graph slower with it (docs/fast-engine.md).
COMBINE_IN_SPLIT = False
TICKETS = 1 << 16  # tickets kept a device: batch x KV heads x row blocks of one call at most, else the 2nd kernel
_TICKETS: dict = {}  # device -> int32 [TICKETS], made outside any capture and kept (graphs record its address)


def _tickets(device: torch.device, needed: int) -> torch.Tensor | None:
    """The device's ticket buffer for a call needing ``needed`` tickets, or None (the separate combine): switched
    off, too many, or none made yet while a graph is being captured (a buffer made then would live in the graph's
    memory pool; a lane's first real run of each graph comes before its capture and makes it)."""
    if not COMBINE_IN_SPLIT or needed > TICKETS:
        return None
    key = str(device)
    if key not in _TICKETS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _TICKETS[key] = torch.zeros(TICKETS, dtype=torch.int32, device=device)
    return _TICKETS[key]


def pending(keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor, pad: torch.Tensor, heads: int,
            batches, q_lens, windows=(None,), table: torch.Tensor | None = None) -> list[tuple]:
    """``(calls, run)`` for :func:`~hf_rstitch.fast.kernels.triton_support.precompile`: the kernels a lane with this
    cache layer (``keys``/``values`` ``[rows, kv_heads, slots, dim]``), ``heads`` query heads, batch buckets
    ``batches`` and length buckets ``q_lens`` launches, built at once rather than one at a time at the first
    capture of each bucket. Empty where the kernel does not run for these heads. A query stands in as an empty
    contiguous tensor (the layout of the rotary functions' outputs)."""
    dim = keys.shape[-1]
    if not runs_for(dim, keys.dtype, keys.device):
        return []

    def run(call):
        b, q, window = call
        query = keys.new_empty(b, heads, q, dim)
        if table is not None:  # a paged pool layer: every row reads it through its table row
            return _launch(query, keys, values, pos, pad[:b], dim ** -0.5, window, table=table[:b])
        return _launch(query, keys[:b], values[:b], pos, pad[:b], dim ** -0.5, window)

    # a window is a specialised integer argument: one per distinct window (and one without) is enough
    kinds = sorted({NO_WINDOW if w is None else w for w in windows})
    return [(tuple((b, q, w) for b in batches for q in q_lens for w in kinds), run)]


@decode_attention_op.register_fake
def _(query, key, value, pos, pad, scale, window=NO_WINDOW, softcap=0.0, sinks=None, table=None):
    batch, heads, q_len, dim = query.shape
    return query.new_empty(batch, q_len, heads, dim)


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, pos, pad,
                     fallback, windows=None, table=None, **kwargs):
    """transformers attention function: the split-K kernel where :func:`supported`, else ``fallback``
    (the matmul attention over the 4D mask). ``pos`` (write offset before this call) and ``pad``
    (``[rows]`` left-padding count of each cache row) are the lane's device tensors, ``windows`` the model's
    per-layer windows (:func:`hf_rstitch.fast.windows.layer_windows`), bound with ``functools.partial`` when the lane
    registers it; ``table``: a paged cache's block table (key / value are then its pool layers, and the lane
    never takes the fallback). ``kwargs`` may carry ``sliding_window``, ``softcap`` and ``s_aux`` (sinks) as
    transformers
    passes them.

    Returns ``([b, q, H, D], None)``.
    """
    window = call_window(module, kwargs, windows)  # a layer disagreeing with its config is refused on every path
    if not supported(query, key):
        return fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    softcap = float(kwargs.get("softcap") or 0.0)
    table = None if table is None else table[: query.shape[0]]
    return torch.ops.hf_rstitch.decode_attention(query, key, value, pos, pad, scale, NO_WINDOW if window is None
                                                 else window, softcap, kwargs.get("s_aux"), table), None
