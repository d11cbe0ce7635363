"""The normalized entropy of each row of logits in two small Triton kernels (the fast engine's).

Why: :func:`hf_rstitch.core.entropy.normalized_entropy` is half a dozen eager kernels over a float32
copy of the logits (cast, log-softmax, exp, product, sum, scale). Every stitched step runs it once or
twice, outside the lanes' CUDA graphs, over a vocabulary of ~152k tokens at large batches. Here one
kernel reads the logits once, in place, each program a chunk of a row, and keeps per lane the
running max ``m``, ``s = sum exp(x - m)`` and ``t = sum exp(x - m) (x - m)``; a second kernel merges
the chunks of each row: ``H = (log s - t / s) / log V``, clamped to [0, 1].

Same value as the eager function up to float32 rounding (summation order): the tests compare them.
Ids whose logit is ``-inf`` count 0, as there; a row that is ``-inf`` everywhere gives 0.

:func:`read_out` is the same pass over a lane's graph output, doing what the decode loop would otherwise
do in three more kernels: it writes the float32 copy of the logits that ``generate`` hands to the logits
processors (rows gathered in the caller's order), and finds each row's greedy token -- ``torch.argmax``'s
answer: the first id of the largest logit, or the first NaN where there is one.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from .triton_support import _triton, available, next_pow2, start
from .triton_support import sm_count as _sm_count  # a module name the tests can patch

BLOCK = 2048  # logits a program reads per inner step
FILL = 2  # programs per SM the chunking aims for


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def _first_best(value, ids, none):
        # (best value, its smallest id) over lanes: NaN first, else the largest; lanes with id < 0 saw nothing
        seen = ids >= 0
        any_nan = tl.max((seen & (value != value)).to(tl.int32), 0) > 0
        largest = tl.max(tl.where(seen & (value == value), value, float("-inf")), 0)
        pick = seen & tl.where(any_nan, value != value, value == largest)
        first = tl.min(tl.where(pick, ids, none), 0)
        return tl.where(any_nan, float("nan"), largest), first

    # Triton resolves the names a kernel calls in its module's globals (the interpreter too), not in a closure
    globals()["_first_best"], globals()["tl"] = _first_best, tl

    @triton.jit
    def chunk_kernel(x_ptr, part_ptr, V, stride_row, chunk, index_ptr, out_ptr, BLOCK: tl.constexpr,
                     GATHER: tl.constexpr, COPY: tl.constexpr, TOP: tl.constexpr):
        # (m, s, t) of logits [split * chunk, +chunk) of one row, in float32, at part[row, split]. GATHER: the
        # row is read from x's row index[row]. COPY: the float32 logits go to out[row]. TOP: the chunk's greedy
        # (value, id) go to part[row, split, 3:5] -- the largest value, first id among equals; NaN beats all.
        row, split, n_splits = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
        src = tl.load(index_ptr + row).to(tl.int64) if GATHER else row
        start = split * chunk
        stop = tl.minimum(start + chunk, V)
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        t = tl.zeros((BLOCK,), tl.float32)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)  # TOP: per lane, the largest value seen
        best_id = tl.full((BLOCK,), -1, tl.int32)  # its id; -1: nothing seen
        for off in range(start, stop, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            inside = cols < stop
            x = tl.load(x_ptr + src * stride_row + cols, mask=inside, other=float("-inf")).to(tl.float32)
            if COPY:
                tl.store(out_ptr + row * V + cols, x, mask=inside)
            if TOP:  # a lane's ids grow with off: a strict > keeps the first of equal values
                nan = x != x
                wins = inside & (best == best) & (nan | (x > best) | (best_id < 0))
                best = tl.where(wins, x, best)
                best_id = tl.where(wins, cols, best_id)
            m_new = tl.maximum(m, x)
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            a = tl.exp(m - safe)  # 0 where nothing was seen yet
            e = tl.exp(x - safe)
            t = a * (t + tl.where(s == 0.0, 0.0, s * (m - safe))) + tl.where(e == 0.0, 0.0, e * (x - safe))
            s = a * s + e
            m = m_new
        top = tl.max(m, 0)
        safe = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(m - safe)
        s_all = tl.sum(w * s, 0)
        t_all = tl.sum(w * (t + tl.where(s == 0.0, 0.0, s * (m - safe))), 0)
        at = part_ptr + 5 * (row * n_splits + split)
        tl.store(at, top)
        tl.store(at + 1, s_all)
        tl.store(at + 2, t_all)
        if TOP:
            value, first = _first_best(best, best_id, 2147483647)
            tl.store(at + 3, value)
            tl.store(at + 4, first.to(tl.float32))  # ids < 2**24: exact in float32

    @triton.jit
    def merge_kernel(part_ptr, out_ptr, top_ptr, n_splits, log_v, BLOCK_S: tl.constexpr, TOP: tl.constexpr):
        row = tl.program_id(0)
        j = tl.arange(0, BLOCK_S)
        at = part_ptr + 5 * (row * n_splits + j)
        ok = j < n_splits
        m = tl.load(at, mask=ok, other=float("-inf"))
        s = tl.load(at + 1, mask=ok, other=0.0)
        t = tl.load(at + 2, mask=ok, other=0.0)
        top = tl.max(m, 0)
        safe = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(m - safe)
        s_all = tl.sum(w * s, 0)
        t_all = tl.sum(w * (t + tl.where(s == 0.0, 0.0, s * (m - safe))), 0)
        h = tl.log(tl.maximum(s_all, 1e-30)) - t_all / tl.maximum(s_all, 1e-30)
        h = tl.where(s_all > 0.0, h / log_v, 0.0)
        tl.store(out_ptr + row, tl.minimum(tl.maximum(h, 0.0), 1.0))
        if TOP:  # splits cover increasing ids: the first best split holds the first best id
            value = tl.load(at + 3, mask=ok, other=float("-inf"))
            ids = tl.load(at + 4, mask=ok, other=-1.0).to(tl.int32)
            _, first = _first_best(value, ids, 2147483647)
            tl.store(top_ptr + row, first.to(tl.int64))

    return chunk_kernel, merge_kernel


def supported(logits: torch.Tensor) -> bool:
    """The kernels run here: a Triton device, contiguous ids, a float dtype other than float64."""
    return (available(logits.device) and logits.dim() >= 1 and logits.shape[-1] >= 2 and logits.numel() > 0
            and logits.stride(-1) == 1 and logits.dtype in (torch.float32, torch.bfloat16, torch.float16))


def _chunks(rows: int, vocab: int, sms: int) -> tuple[int, int]:
    """(splits a row, ids a split): enough programs for :data:`FILL` a SM, whole blocks each."""
    splits = max(1, min(-(-FILL * sms // rows), -(-vocab // BLOCK)))
    chunk = -(-(-(-vocab // splits)) // BLOCK) * BLOCK
    return -(-vocab // chunk), chunk


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``[...]`` float32 normalized entropy of softmax(``logits``) over the last axis (see the module
    docstring), for logits :func:`supported` takes."""
    vocab = logits.shape[-1]
    x = logits.reshape(-1, vocab)
    if x.stride(-1) != 1:
        x = x.contiguous()
    _, entropy, _ = _launch(x, None, copy=False, top=False)
    return entropy.reshape(logits.shape[:-1])


def read_out(logits: torch.Tensor, index: torch.Tensor | None = None):
    """``(copy, entropy, greedy)`` of the rows ``index`` (all rows when None) of ``logits`` ``[R, V]``, in one
    pass: ``copy`` ``[B, V]`` float32 (contiguous, new), ``entropy`` ``[B]`` as :func:`normalized_entropy`,
    ``greedy`` ``[B]`` long as ``torch.argmax(copy, -1)``. ``logits`` as :func:`supported` takes, 2-D; ``index`` a
    long tensor on its device."""
    if logits.dim() != 2:
        raise ValueError(f"read_out takes [rows, vocab] logits, got shape {tuple(logits.shape)}")
    if logits.shape[-1] >= 1 << 24:
        raise ValueError(f"read_out keeps ids in float32: vocabularies below 2**24 only, got {logits.shape[-1]}")
    return _launch(logits, index, copy=True, top=True)


def _launch(x: torch.Tensor, index: torch.Tensor | None, copy: bool, top: bool):
    vocab, dev = x.shape[-1], x.device
    rows = x.shape[0] if index is None else index.shape[0]
    splits, chunk = _chunks(rows, vocab, _sm_count(dev))
    part = torch.empty(rows * splits * 5, dtype=torch.float32, device=dev)
    entropy = torch.empty(rows, dtype=torch.float32, device=dev)
    out = torch.empty(rows, vocab, dtype=torch.float32, device=dev) if copy else part
    greedy = torch.empty(rows, dtype=torch.long, device=dev) if top else None
    chunk_kernel, merge_kernel = _kernels()
    # Triton launches on the current device: make it the logits' (a pair split over GPUs); a context only then
    away = dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device()
    with torch.cuda.device(dev) if away else contextlib.nullcontext():
        start(chunk_kernel, (rows, splits))(x, part, vocab, x.stride(0), chunk, index if index is not None else part,
                                            out, BLOCK=BLOCK, GATHER=index is not None, COPY=copy, TOP=top, num_warps=8)
        start(merge_kernel, (rows,))(part, entropy, greedy if top else entropy, splits, math.log(vocab),
                                     BLOCK_S=max(16, next_pow2(splits)), TOP=top, num_warps=1)
    return (out if copy else None), entropy, greedy
