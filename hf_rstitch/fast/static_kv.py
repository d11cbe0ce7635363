"""A static KV cache for a batch of rows and the attention that reads it.

Slot ``j`` of every layer holds column ``j`` of the stitched sequence (prompt padding included)
for every row: all rows of a batch share the column index (the stitch loop brings every row up
to date on every call), so a lane never needs a per-row slot map, only a per-row mask of the
slots that hold left padding. The write offset ``pos`` is a device scalar advanced
by the captured step itself: a CUDA graph recorded once writes to the right slots on every
replay, with no host round trip. transformers' ``StaticCache`` would do the same, but its
offset lives inside each layer object and its attention repeats the KV heads (``repeat_kv``)
whenever a mask is given, copying the whole static cache every step; this cache is a few
lines and its attention folds the query heads of a KV group onto the query axis instead.

Rows: the buffers hold ``rows`` cache rows; a forward over ``b <= rows`` rows (the lane's batch
bucket) reads and writes rows ``[0, b)``. Which live row sits in which cache row is the lane's
business (:mod:`hf_rstitch.fast.rows`).

Sliding windows: every slot is kept; the attentions read a layer's window only (:mod:`.windows`).

What it does not do: cropping, ring buffers.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface, PretrainedConfig

from .windows import call_window

ATTENTIONS = {"matmul": "rstitch_static", "sdpa": "rstitch_static_sdpa"}  # FastConfig.attention -> registered name


class StaticKV:
    """Per-layer key/value buffers ``[rows, H_kv, slots, D]`` (views of one buffer ``states``) written at
    ``pos + arange(q)``.

    transformers' attention layers call :meth:`update` with their new keys/values; the lane sets
    :attr:`slots` before each forward and advances :attr:`pos` after it.
    """

    def __init__(self, config: PretrainedConfig, slots: int, dtype: torch.dtype, device: torch.device, rows: int = 1,
                 shape: tuple[int, int, int] | None = None):
        # shape: (layers, kv_heads, head_dim) as the layers store them (.kv_shapes); None: read from the config
        text = config.get_text_config()
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        layers, kv_heads, head_dim = shape or (text.num_hidden_layers, kv_heads, head_dim)
        # one buffer [2, layers, rows, H_kv, slots, D]: a row operation over every layer is one kernel
        self.states = torch.zeros((2, layers, rows, kv_heads, slots, head_dim), dtype=dtype, device=device)
        self.keys = list(self.states[0].unbind(0))  # per layer [rows, H_kv, slots, D], views of ``states``
        self.values = list(self.states[1].unbind(0))
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # slots written so far
        self.slots: torch.Tensor | None = None  # [q] slots the current forward writes
        self._scratch: torch.Tensor | None = None  # one row of every layer, for moving a row's slots
        self.fused_store = False  # update() writes keys and values with one Triton kernel (set by the lane)
        self.pending = None  # a rotation put off until update() (rope_store.Pending), inside rope_store.deferring

    @property
    def n_slots(self) -> int:
        return self.keys[0].shape[2]

    def nbytes(self) -> int:
        return self.states.numel() * self.states.element_size()

    @property
    def head_dim(self) -> int:
        return self.keys[0].shape[3]

    @property
    def n_rows(self) -> int:
        return self.keys[0].shape[0]

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """Slots written so far: the device write offset (a 0-dim tensor, never read back to the host)."""
        return self.pos

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [b, H_kv, q, D] -> slots[0..q) of rows [0, b) of layer `layer_idx`; returns all their slots
        b = key_states.shape[0]
        keys, values = self.keys[layer_idx][:b], self.values[layer_idx][:b]
        pending, self.pending = self.pending, None
        if pending is not None:  # q and k rotated, k and v stored: one kernel (hf_rstitch.fast.kernels.rope_store)
            if pending.k is not key_states:
                raise RuntimeError(f"layer {layer_idx} stored other keys than it rotated; this model's attention "
                                   "code is not the one the fast engine's deferred rotation supports. Build the lane "
                                   "with FastConfig(fuse_rope_store=False).")
            pending.store(key_states, value_states, self.slots, keys, values)
        elif self.fused_store:  # one kernel for both (hf_rstitch.fast.kernels.rope_store)
            torch.ops.hf_rstitch.store_kv(key_states, value_states, self.slots, keys, values)
        else:
            keys.index_copy_(2, self.slots, key_states)
            values.index_copy_(2, self.slots, value_states)
        return keys, values

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, n_slots: int) -> None:
        """Copy cache rows ``src`` to ``dst`` (device long tensors), slots ``[0, n_slots)`` of every layer."""
        self.states[:, :, dst, :, :n_slots] = self.states[:, :, src, :, :n_slots]

    def copy_row(self, other: "StaticKV", src: int, dst: int, n_slots: int) -> None:
        """Slots ``[0, n_slots)`` of ``other``'s cache row ``src`` into row ``dst`` of this cache, every layer
        (one copy; the caches must share model, dtype and device)."""
        self.states[:, :, dst, :, :n_slots].copy_(other.states[:, :, src, :, :n_slots])

    def copy_rows(self, other: "StaticKV", src: list[int], dst: list[int], n_slots: int) -> None:
        """:meth:`copy_row` for each pair of ``src`` / ``dst`` (a join's rows): a copy each, no temporary (a gather
        of several rows' slots would hold them all twice)."""
        for s, d in zip(src, dst):
            self.copy_row(other, s, d, n_slots)

    def copy_slots(self, other: "StaticKV", src: int, src_start: int, dst: int, dst_start: int, n: int) -> None:
        """``n`` slots of ``other``'s cache row ``src`` from ``src_start`` into row ``dst`` of this cache from
        ``dst_start``, every layer (one copy): a row whose columns sit elsewhere in the two caches."""
        self.states[:, :, dst, :, dst_start:dst_start + n].copy_(other.states[:, :, src, :, src_start:src_start + n])

    def shift_row(self, row: int, by: int, n_slots: int) -> None:
        """Move the written slots of cache row ``row`` by ``by`` in every layer: ``by = 1`` moves slots
        ``[0, n_slots - 1)`` one right (slot 0 zeroed, slot ``n_slots - 1`` overwritten); a negative ``by``
        moves slots ``[-by, n_slots)`` to the front. Two copies through a one-row scratch buffer (kept:
        a fresh temporary of a growing size would make the allocator reserve a new block every few steps)."""
        if self._scratch is None:
            self._scratch = torch.empty_like(self.states[:, :, 0])  # [2, layers, H_kv, slots, D]
        state = self.states[:, :, row]
        src, dst = (slice(0, n_slots - by), slice(by, n_slots)) if by > 0 else (slice(-by, n_slots), slice(0, n_slots + by))
        width = src.stop - src.start
        if width > 0:
            tmp = self._scratch[..., :width, :]
            tmp.copy_(state[..., src, :])
            state[..., dst, :].copy_(tmp)
        if by > 0:
            state[..., :by, :].zero_()


KV_CHUNK = 256  # slots per partial product in :func:`_weighted_values`; lanes size their caches in multiples


def static_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, pos=None,
                     windows=None, **kwargs):
    """Attention over every slot of a :class:`StaticKV` layer under a boolean mask, GQA without copies.

    The same arithmetic as transformers' eager attention (scores in the model's dtype, softmax in
    at least float32), laid out for decoding: the query heads of a KV group are stacked on the query axis,
    and the weighted sum over slots is split into chunks (:func:`_weighted_values`). A fused SDPA
    kernel with a mask would run one thread block per KV head here and walk all slots in sequence
    -- a fixed cost of milliseconds per token on long static caches, whatever the model size.

    Args:
        query: ``[b, H, q, D]``; key / value: ``[b, H_kv, S, D]`` (all slots);
        attention_mask: ``[b, 1, q, S]`` bool, True where a query may attend (full attention).
        pos: the write offset before this call (device scalar; query ``i`` sits at slot ``pos + i``), needed
            for a sliding-window layer; windows: the model's per-layer windows (:func:`.windows.layer_windows`).
        kwargs: ``sliding_window``, ``softcap`` (``softcap * tanh(scores / softcap)``) and ``s_aux`` (gpt-oss's
            sink logit of each head, in the softmax's denominator only) as transformers passes them.

    Returns:
        ``([b, q, H, D], None)`` as transformers' attention functions do.
    """
    batch, heads, q, dim = query.shape
    attention_mask = _windowed(attention_mask, call_window(module, kwargs, windows), pos)
    query, mask = _fold_groups(query, key.shape[1], attention_mask)
    scale = dim**-0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale  # [b, H_kv, group * q, S]
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))  # every row keeps its own slot: no empty rows
    probs = _softmax(scores, kwargs.get("s_aux"), q).to(value.dtype)
    out = _weighted_values(probs, value)  # [b, H_kv, group * q, D]
    return out.reshape(batch, heads, q, dim).transpose(1, 2).contiguous(), None  # [b, q, H, D]


def _windowed(mask: torch.Tensor, window: int | None, pos: torch.Tensor | None) -> torch.Tensor:
    """``mask`` ``[b, 1, q, S]`` cut to slots ``(pos + i - window, pos + i]`` for query ``i`` (None: as is)."""
    if window is None:
        return mask
    if pos is None:
        raise ValueError("a sliding-window layer needs the write offset: call the static attention through a lane "
                         "(which binds pos=), or pass pos= yourself.")
    q, slots = mask.shape[-2:]
    mine = pos + torch.arange(q, device=mask.device)  # [q]
    return mask & (torch.arange(slots, device=mask.device)[None, :] > (mine[:, None] - window))


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None, q: int) -> torch.Tensor:
    """Softmax over the slots, in at least float32; with ``sinks`` (``[H]``, one logit a query head) each head's
    sink joins the denominator as one more column (gpt-oss's eager attention), then is dropped."""
    dtype = _at_least_fp32(scores.dtype)
    if sinks is None:
        return scores.softmax(-1, dtype=dtype)
    batch, kv_heads, rows, slots = scores.shape  # rows = group * q: head kv * group + g, query i -> g * q + i
    sink = sinks.to(scores.dtype).reshape(kv_heads, rows // q, 1).expand(kv_heads, rows // q, q)
    both = torch.cat([scores, sink.reshape(1, kv_heads, rows, 1).expand(batch, -1, -1, -1)], dim=-1)
    both = both - both.amax(-1, keepdim=True)
    return both.softmax(-1, dtype=dtype)[..., :-1]


def _fold_groups(query: torch.Tensor, kv_heads: int, attention_mask: torch.Tensor):
    """Stack the query heads of each KV group on the query axis, and repeat the mask to match.

    Head ``h = kv * group + g`` reads KV head ``kv``; it becomes row ``g * q + i`` of KV head
    ``kv``, so no copy of the keys and values is needed. Returns query ``[b, H_kv, group * q, D]``
    and mask ``[b, 1, group * q, S]``.
    """
    batch, heads, q, dim = query.shape
    group, slots = heads // kv_heads, attention_mask.shape[-1]
    mask = attention_mask[:, :, None].expand(batch, 1, group, q, slots).reshape(batch, 1, group * q, slots)
    return query.reshape(batch, kv_heads, group * q, dim), mask


def _weighted_values(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``probs @ value`` as a sum of per-chunk products (split-K by hand).

    A decode step has a handful of query rows and thousands of slots: one matrix product would
    reduce over all slots in a few thread blocks. Cutting the slots into chunks of
    :data:`KV_CHUNK` gives one independent product per chunk, summed in float32.
    """
    batch, kv_heads, rows, slots = probs.shape
    chunks = slots // KV_CHUNK
    if chunks <= 1 or slots % KV_CHUNK:
        return torch.matmul(probs, value)
    p = probs.view(batch, kv_heads, rows, chunks, KV_CHUNK).transpose(2, 3)  # [b, H_kv, C, rows, K]
    v = value.view(batch, kv_heads, chunks, KV_CHUNK, value.shape[-1])  # [b, H_kv, C, K, D]
    return torch.matmul(p, v).sum(2, dtype=_at_least_fp32(value.dtype)).to(value.dtype)


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays


def static_attention_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, pos=None,
                          windows=None, **kwargs):
    """As :func:`static_attention`, through one fused ``scaled_dot_product_attention`` call (layers with a
    ``softcap`` or sinks take :func:`static_attention`: SDPA has neither).

    Fewer kernels per layer (about 3 instead of about 12), but with a boolean mask PyTorch runs
    the memory-efficient kernel, whose thread blocks each walk all slots of one KV head. Which
    costs less per token depends on the GPU and the cache size: ``FastConfig(attention=...)``
    picks one, ``benchmarks/engine_profile.py`` measures both.
    """
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return static_attention(module, query, key, value, attention_mask, scaling, dropout, pos=pos, windows=windows,
                                **kwargs)
    batch, heads, q, dim = query.shape
    attention_mask = _windowed(attention_mask, call_window(module, kwargs, windows), pos)
    query, mask = _fold_groups(query, key.shape[1], attention_mask)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTIONS["matmul"], static_attention)
AttentionInterface.register(ATTENTIONS["sdpa"], static_attention_sdpa)


@contextlib.contextmanager
def static_attention_on(model, kind: str = "matmul"):
    """Route ``model``'s attention layers to :func:`static_attention` (``kind="matmul"``),
    :func:`static_attention_sdpa` (``"sdpa"``) or any other function registered with transformers'
    ``AttentionInterface`` under the name ``kind`` inside the block.

    Only Python-side dispatch changes; a CUDA graph captured inside keeps the kernels it recorded.
    """
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTIONS.get(kind, kind)
    try:
        yield
    finally:
        config._attn_implementation = before
