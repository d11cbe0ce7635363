"""One kernel where a decode step's attention ran four: rotate q and k, store k and v.

Why: each layer of a step rotated its queries and keys (two kernels even when ``compile="parts"``
fuses each, an unfused dozen otherwise) and wrote its keys and values into the static cache (two
``index_copy_``); each is a launch of a microsecond-scale kernel, 28 layers a token for Qwen2.

* :func:`rotate_qk`: the rotary embedding of ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) *
  sin``) for q and k in one launch, rounded as the eager code rounds (each product, then the sum).
  :func:`plan` installs it in place of a model module's ``apply_rotary_pos_emb`` only where that
  function gives the same result on a probe (so interleaved or partial rotary embeddings keep theirs),
  and each call falls back to the model's function for shapes the kernel does not take.
* :func:`store_kv`: keys and values of a forward into their cache slots in one launch
  (:meth:`hf_rstitch.fast.static_kv.StaticKV.update` uses it when the lane says so).
* :func:`rope_store`: both in one launch (lanes use it while :data:`DEFER` is set, the default). Inside
  :func:`deferring` (a lane's forward) the installed rotary function returns an empty q and the
  unrotated k, and the cache's ``update`` -- the next thing a Llama-family attention layer does with
  them -- runs this kernel, which fills q, writes the rotated keys and the values into their slots. A
  layer that stores other keys than it rotated is refused; one that reads q before storing its keys
  would read it empty, so a lane first checks the model (:func:`defers_exactly`): a one-token forward
  with q left as NaN until the store must give the logits of one without deferral, or the model keeps
  the two kernels.

Both are custom ops (a CUDA graph records the launch); the lane uses them where Triton runs and the
step is not compiled whole (``compile="decode"``/``"all"`` fuse these themselves).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref

import torch

from .gemv import DTYPES
from .rotary_modules import rotary_functions
from .triton_support import _triton, available, next_pow2, pdl, start


@functools.lru_cache(maxsize=1)
def _rotate_one_fn():
    triton, tl = _triton()

    @triton.jit
    def _rotate_one(src, dst, cos_at, sin_at, nw, eps, HALF: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr):
        # one head of one token: dst = src * cos + rotate_half(src) * sin, rounded as eager code rounds; with NORM
        # src is first RMS-normalized over the head with weight nw, as Llama's RMSNorm rounds it (Qwen3's q/k norms)
        d = tl.arange(0, BLOCK)
        ok = d < HALF
        c1 = tl.load(cos_at + d, mask=ok, other=0.0).to(tl.float32)
        c2 = tl.load(cos_at + HALF + d, mask=ok, other=0.0).to(tl.float32)
        s1 = tl.load(sin_at + d, mask=ok, other=0.0).to(tl.float32)
        s2 = tl.load(sin_at + HALF + d, mask=ok, other=0.0).to(tl.float32)
        dtype = dst.dtype.element_ty
        x1 = tl.load(src + d, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF + d, mask=ok, other=0.0).to(tl.float32)
        if NORM:  # (w * (x * rstd).to(dtype)).to(dtype), rstd = 1 / sqrt(mean(x^2) + eps) in float32
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
            w1 = tl.load(nw + d, mask=ok, other=0.0).to(tl.float32)
            w2 = tl.load(nw + HALF + d, mask=ok, other=0.0).to(tl.float32)
            x1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
            x2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        y1 = (x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)
        y2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
        tl.store(dst + d, y1.to(dtype), mask=ok)
        tl.store(dst + HALF + d, y2.to(dtype), mask=ok)

    # Triton resolves the names a kernel calls in its module's globals (the interpreter too), not in a closure
    globals()["_rotate_one"] = _rotate_one
    return _rotate_one


@functools.lru_cache(maxsize=1)
def _rotate_kernel():
    triton, tl = _triton()
    _rotate_one_fn()
    _slot_at_fn()

    @triton.jit
    def rotate_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, slots_ptr, values_ptr, table_ptr, pad_ptr,
                      qn_ptr, kn_ptr, eps, S, HQ, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sc_b, sc_s,
                      ss_b, ss_s, c_b, c_h, c_s, st_b, HALF: tl.constexpr, BLOCK: tl.constexpr, STORE: tl.constexpr,
                      PDL: tl.constexpr, PAGE: tl.constexpr, NORM: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # one program: one head of one token. q heads: rotated into qo. k heads: rotated into ko ([b, Hk, s, D]),
        # or with STORE into their cache slots (ko: the layer's keys), the token's v head copied into its slot
        bs, h = tl.program_id(0), tl.program_id(1)
        b, i = bs // S, bs % S
        if h < HQ:
            src = q_ptr + b * sq_b + h * sq_h + i * sq_s
            dst = qo_ptr + ((b * HQ + h) * S + i) * 2 * HALF
            nw = qn_ptr
        else:
            nw = kn_ptr
            hk = h - HQ
            src = k_ptr + b * sk_b + hk * sk_h + i * sk_s
            if STORE:
                at = _slot_at(slots_ptr, table_ptr, pad_ptr, b, i, c_b, c_s, st_b, PAGE) + hk * c_h
                dst = ko_ptr + at
                d = tl.arange(0, 2 * BLOCK)
                ok = d < 2 * HALF
                tl.store(values_ptr + at + d, tl.load(v_ptr + b * sv_b + hk * sv_h + i * sv_s + d, mask=ok), mask=ok)
            else:
                dst = ko_ptr + ((b * (tl.num_programs(1) - HQ) + hk) * S + i) * 2 * HALF
        _rotate_one(src, dst, cos_ptr + b * sc_b + i * sc_s, sin_ptr + b * ss_b + i * ss_s, nw, eps, HALF, BLOCK, NORM)

    return rotate_kernel


@functools.lru_cache(maxsize=1)
def _slot_at_fn():
    triton, tl = _triton()

    @triton.jit
    def _slot_at(slots_ptr, table_ptr, pad_ptr, b, i, c_b, c_s, st_b, PAGE: tl.constexpr):
        # offset of token i of row b in the cache: static (PAGE == 0), slot slots[i] of cache row b; paged, the
        # row's token slots[i] - pad[b] in block table[b, token // PAGE] (the trash block 0 left of the padding)
        slot = tl.load(slots_ptr + i)
        if PAGE > 0:
            token = slot - tl.load(pad_ptr + b)
            kept = tl.maximum(token, 0)
            block = tl.load(table_ptr + b * st_b + kept // PAGE).to(tl.int64)
            block = tl.where(token >= 0, block, 0)
            return block * c_b + (kept % PAGE) * c_s
        else:
            return b * c_b + slot * c_s

    globals()["_slot_at"] = _slot_at
    return _slot_at


@functools.lru_cache(maxsize=1)
def _store_kernel():
    triton, tl = _triton()
    _slot_at_fn()

    @triton.jit
    def store_kernel(k_ptr, v_ptr, slots_ptr, keys_ptr, values_ptr, table_ptr, pad_ptr, H, S,
                     sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, c_b, c_h, c_s, st_b, D: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr, PAGE: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # one program: token i of head h of row b -> slot slots[i] of the layer's keys and values
        p = tl.program_id(0)
        i, h, b = p % S, (p // S) % H, p // (S * H)
        d = tl.arange(0, BLOCK)
        ok = d < D
        at = _slot_at(slots_ptr, table_ptr, pad_ptr, b, i, c_b, c_s, st_b, PAGE) + h * c_h + d
        tl.store(keys_ptr + at, tl.load(k_ptr + b * sk_b + h * sk_h + i * sk_s + d, mask=ok), mask=ok)
        tl.store(values_ptr + at, tl.load(v_ptr + b * sv_b + h * sv_h + i * sv_s + d, mask=ok), mask=ok)

    return store_kernel


@torch.library.custom_op("hf_rstitch::rope_store", mutates_args=("q_out", "keys", "values"))
def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               slots: torch.Tensor, q_out: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               table: torch.Tensor | None = None, pad: torch.Tensor | None = None, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 0.0) -> None:
    """In one launch: ``q_out = rotate(q)`` (contiguous ``[b, Hq, s, D]``), ``keys[:b, :, slots] = rotate(k)`` and
    ``values[:b, :, slots] = v``; what :func:`rotate_qk` then :func:`store_kv` compute. With ``table`` (``[b, width]``
    int32) and ``pad`` (``[b]``) the cache is paged (:mod:`.paged_kv`): ``keys`` / ``values`` are a pool layer
    ``[blocks, H, BLOCK, D]`` and slot ``j`` of row ``r`` is token ``j - pad[r]`` of the row's blocks. With ``q_norm``
    and ``k_norm`` (``[D]`` weights of per-head RMSNorms, Qwen3's) q and k are normalized first (:func:`~.rotary_modules.norm_plan`)."""
    b, hq, s, dim = q.shape
    on = pdl(q.device, b * s)
    table_, pad_, page, st_b, strides = _paging(keys, slots, table, pad)
    norm = q_norm is not None and k_norm is not None
    start(_rotate_kernel(), (b * s, hq + k.shape[1]))(
        q, k, v, cos, sin, q_out, keys, slots, values, table_, pad_, q_norm if norm else q, k_norm if norm else q,
        float(eps), s, hq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], cos.stride(0), cos.stride(1),
        sin.stride(0), sin.stride(1), *strides, st_b, HALF=dim // 2, BLOCK=next_pow2(dim // 2), STORE=True,
        num_warps=1, PDL=on, launch_pdl=on, PAGE=page, NORM=norm)


def _paging(keys: torch.Tensor, slots: torch.Tensor, table, pad):
    """Kernel arguments for a static layer ``[rows, H, slots, D]`` (``table`` None) or a paged pool layer
    ``[blocks, H, BLOCK, D]``: (table, pad, block size or 0, table row stride, cache strides (row or block,
    head, token))."""
    if table is None:
        return slots, slots, 0, 0, keys.stride()[:3]
    return table, pad, keys.shape[2], table.stride(0), keys.stride()[:3]


class Pending:
    """A rotation :func:`_rotary` put off until the cache stores the keys (``StaticKV.update`` or
    ``PagedKV.update``, both through :meth:`store`): the layer got ``q_out`` (filled by then) and the unrotated ``k``
    it will hand to the cache."""

    def __init__(self, q, k, cos, sin, q_out, norms=None):
        self.q, self.k, self.cos, self.sin, self.q_out = q, k, cos, sin, q_out
        self.norms = norms  # (q_norm weight, k_norm weight, eps): q and k still to normalize (norm_plan), or None

    def store(self, k, v, slots, keys, values, table=None, pad=None) -> None:
        """Rotate (normalize first where the norms were put off too) and store: one launch; paged with ``table``
        and ``pad`` (:func:`rope_store`)."""
        qn, kn, eps = self.norms or (None, None, 0.0)
        torch.ops.hf_rstitch.rope_store(self.q, k, v, self.cos, self.sin, slots, self.q_out, keys, values, table, pad,
                                        qn, kn, eps)


# Lanes put rotations off to the cache's update (one kernel, rope_store) when True, for models that pass
# defers_exactly: 28 kernels fewer a Qwen2 step (timed: benchmarks/results/engine_rope_store_*.md).
DEFER = True
_DEFER_TO = None  # the cache (StaticKV or PagedKV) whose update() completes the rotations, in deferring()
_POISON = False  # deferring(..., poison=True): q starts as NaN until the store fills it
# Inside deferring(), per-head q/k RMSNorms of rotary_modules.norm_plan() put off to the same kernel when True
# (Qwen3: 56 kernels fewer a step); their inputs wait here as (tensor, fallback norm) until the rotation takes them
NORMS = True
_MARKS: list = []
_VERDICTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> defers_exactly's answer


@contextlib.contextmanager
def deferring(cache, poison: bool = False, norms=()):
    """Inside the block the installed rotary functions leave q and k to ``cache.update`` (one kernel for the
    rotation and the cache writes, :func:`rope_store`) where the shapes allow; ``cache`` None: no change.
    ``poison``: the q handed to the layer holds NaN until the store, so code that reads it early shows.
    ``norms``: q/k norm modules (:func:`~.rotary_modules.norm_plan`) whose normalization the same kernel does (with :data:`NORMS`);
    a norm whose output no rotation took is an error at the end of the block."""
    global _DEFER_TO, _POISON
    before = _DEFER_TO, _POISON
    _DEFER_TO, _POISON = cache, poison
    installed = _put_off(norms) if cache is not None and NORMS else []
    try:
        yield
        if _MARKS:
            raise RuntimeError("a layer of this model used the output of a q/k norm the fast engine put off to the "
                               "rotation without rotating it; set hf_rstitch.fast.kernels.rope_store.NORMS = False "
                               "(or build the lane with FastConfig(fuse_rope_store=False)).")
    finally:
        _DEFER_TO, _POISON = before
        _MARKS.clear()
        for m, forward in installed:
            if forward is None:
                del m.forward
            else:
                m.forward = forward


def _put_off(norms) -> list:
    """Install on each norm module a forward that hands its input on unnormalized, marked for the rotation
    (:func:`_deferred_norm`); returns ``(module, the forward it had in its __dict__ or None)`` to restore."""
    installed = []
    for m in norms:
        before = m.__dict__.get("forward")
        fallback = before if before is not None else functools.partial(type(m).forward, m)
        m.forward = functools.partial(_deferred_norm, m, fallback)
        installed.append((m, before))
    return installed


def _deferred_norm(module, fallback, x: torch.Tensor) -> torch.Tensor:
    """A q/k norm inside :func:`deferring`: ``x`` itself, marked for the rotation to normalize (which applies
    ``fallback`` itself where it cannot put the norm off); other shapes and dtypes are normalized now."""
    if x.dtype != module.weight.dtype or x.dim() != 4 or x.shape[-1] != module.weight.shape[0]:
        return fallback(x)
    _MARKS.append((x, module, fallback))
    return x


def _take_mark(t: torch.Tensor):
    """``(module, fallback)`` of the put-off norm whose output ``t`` is (as a ``[b, H, s, D]`` transposed view of
    its ``[b, s, H, D]`` input), removed from the marks; None when ``t`` came through no put-off norm."""
    for i, (x, module, fallback) in enumerate(_MARKS):
        if x.data_ptr() == t.data_ptr() and x.transpose(1, 2).shape == t.shape and \
                x.transpose(1, 2).stride() == t.stride():
            del _MARKS[i]
            return module, fallback
    return None


def _normed(t: torch.Tensor, mark) -> torch.Tensor:
    """``t`` normalized now by the put-off norm ``mark`` (a norm over the last axis: transposes commute)."""
    return t if mark is None else mark[1](t)


def defers_exactly(model: torch.nn.Module, forward) -> bool:
    """Whether ``model``'s attention layers may put their rotation off to the cache (asked once a model).

    ``forward(defer, poison)`` runs one forward of the model and returns its logits, with the rotation put off
    (q left as NaN until the store) or not. The model passes when the two agree: its layers hand the keys
    they rotated to the cache and read q only after. Otherwise (e.g. a layer that scales q or normalises k
    after the rotation) it keeps the two kernels, and the lane says nothing: same tokens, one launch more.
    """
    if model not in _VERDICTS:
        want = forward(False, False)
        try:
            got = forward(True, True)
        except RuntimeError:  # stored other keys than it rotated, or none
            got = None
        scale = float(want.abs().max()) if want.numel() else 0.0
        _VERDICTS[model] = got is not None and bool(torch.isfinite(got).all()) and torch.allclose(
            got, want, rtol=1e-3, atol=1e-3 * max(scale, 1.0))
    return _VERDICTS[model]


@torch.library.custom_op("hf_rstitch::rotate_qk", mutates_args=())
def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k`` ``[b, H, s, D]`` (last dim contiguous), ``cos, sin`` ``[b, s, D]`` -> rotated (contiguous)."""
    b, hq, s, dim = q.shape
    qo, ko = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    on = pdl(q.device, b * s)
    start(_rotate_kernel(), (b * s, hq + k.shape[1]))(
        q, k, k, cos, sin, qo, ko, cos, ko, cos, cos, q, q, 0.0, s, hq, *q.stride()[:3], *k.stride()[:3],
        *k.stride()[:3], cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), 0, 0, 0, 0,
        HALF=dim // 2, BLOCK=next_pow2(dim // 2), STORE=False, num_warps=1, PDL=on, launch_pdl=on, PAGE=0, NORM=False)
    return qo, ko


@rotate_qk.register_fake
def _(q, k, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("hf_rstitch::store_kv", mutates_args=("keys", "values"))
def store_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
             table: torch.Tensor | None = None, pad: torch.Tensor | None = None) -> None:
    """``keys[:b, :, slots] = k`` and ``values[:b, :, slots] = v`` for ``k, v`` ``[b, H, q, D]`` (one launch); paged
    with ``table`` and ``pad`` as :func:`rope_store`."""
    b, h, q, dim = k.shape
    on = pdl(k.device, b * q)
    table_, pad_, page, st_b, strides = _paging(keys, slots, table, pad)
    start(_store_kernel(), (b * h * q,))(
        k, v, slots, keys, values, table_, pad_, h, q, *k.stride()[:3], *v.stride()[:3], *strides, st_b,
        D=dim, BLOCK=next_pow2(dim), num_warps=1, PDL=on, launch_pdl=on, PAGE=page)


def rotate_takes(q, k, cos, sin, unsqueeze_dim=1) -> bool:
    """The shapes :func:`rotate_qk` takes: ``[b, H, s, D]`` heads, ``[b, s, D]`` tables, even D, one dtype."""
    return (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.shape == cos.shape
            and q.shape[0] == k.shape[0] == cos.shape[0] and q.shape[2] == k.shape[2] == cos.shape[1]
            and q.shape[3] == k.shape[3] == cos.shape[2] and q.shape[3] % 2 == 0
            and q.stride(3) == k.stride(3) == cos.stride(2) == sin.stride(2) == 1
            and q.dtype == k.dtype == cos.dtype == sin.dtype and q.device == k.device == cos.device)


def _rotary(original):
    @functools.wraps(original)
    def rotary(q, k, cos, sin, *args, **kwargs):
        q_mark, k_mark = (_take_mark(t) if _MARKS else None for t in (q, k))
        if not args and not (set(kwargs) - {"unsqueeze_dim"}) and rotate_takes(q, k, cos, sin, **kwargs):
            cache = _DEFER_TO
            if cache is not None and cache.pending is None:  # the cache's update() rotates and stores at once
                norms = None
                if q_mark is not None and k_mark is not None:  # ... and normalizes first
                    norms = (q_mark[0].weight, k_mark[0].weight, q_mark[0].variance_epsilon)
                else:
                    q, k = _normed(q, q_mark), _normed(k, k_mark)
                if _POISON:
                    q_out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
                else:
                    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
                cache.pending = Pending(q, k, cos, sin, q_out, norms)
                return q_out, k
            return torch.ops.hf_rstitch.rotate_qk(_normed(q, q_mark), _normed(k, k_mark), cos, sin)
        return original(_normed(q, q_mark), _normed(k, k_mark), cos, sin, *args, **kwargs)

    return rotary


def _same_on_probe(fn, device, dtype) -> bool:
    """Whether a module's ``apply_rotary_pos_emb`` computes what :func:`rotate_qk` computes."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, h, 3, 16, generator=gen).to(device, dtype) for h in (4, 2))
    angle = torch.randn(2, 3, 8, generator=gen)
    cos, sin = (torch.cat([f(angle), f(angle)], dim=-1).to(device, dtype) for f in (torch.cos, torch.sin))
    try:
        want = fn(q, k, cos, sin)
    except Exception:  # noqa: BLE001 - another signature: not the standard rotary embedding
        return False
    try:
        got = rotate_qk(q, k, cos, sin)
    except Exception as exc:  # noqa: BLE001 - the kernel does not build or run here: keep the model's function
        warnings.warn(f"the fused rotary kernel failed on {device} ({type(exc).__name__}: {exc}); the model's "
                      "apply_rotary_pos_emb runs instead. Please report it.", stacklevel=2)
        return False
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    return all(isinstance(w, torch.Tensor) and w.shape == g.shape and torch.allclose(w.float(), g.float(), **tol)
               for w, g in zip(want, got))


def plan(model: torch.nn.Module) -> list:
    """``(module, "apply_rotary_pos_emb", replacement)`` for the modelling modules of ``model`` whose
    rotary embedding the kernel reproduces (empty where Triton does not run on the model's device, and
    for float64 models)."""
    device, dtype = model.device, model.dtype
    if not available(device) or dtype not in DTYPES:  # the kernel rotates in float32: no float64
        return []
    return [(module, "apply_rotary_pos_emb", _rotary(fn)) for module, fn in rotary_functions(model)
            if _same_on_probe(fn, device, dtype)]
