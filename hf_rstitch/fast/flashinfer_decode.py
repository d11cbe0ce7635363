"""FlashInfer's paged decode attention over the fast engine's static caches: an optional alternative to
:mod:`.decode_attention`, for where FlashInfer is installed (the ``flashinfer`` extra: ``pip install
flashinfer-python``; it builds its kernels with nvcc on first use). The engine does not use it (docs/kernels.md).

Why it exists: to measure the field's library against our split-K kernel on the caches the engine holds
(the benchmark that did, retired: ``git show 409c85c:benchmarks/kernels_vs_flashinfer.py``), and to run it
where it wins; :func:`why_not` says why it cannot run (FlashInfer missing, not CUDA, a head size or dtype it
lacks) and the caller keeps our kernel.

How: a static cache layer ``[rows, kv_heads, slots, dim]`` is, to FlashInfer, ``rows`` pages of ``slots``
entries in its ``HND`` layout, page ``b`` for row ``b``: nothing is copied. FlashInfer plans a step on the
host from the rows' lengths (:meth:`PagedDecode.plan`: 0.1-0.8 ms of host time measured on an H200, never
inside a CUDA graph);
with ``cuda_graph=True`` its index buffers stay where they are, so a graph captured around :meth:`run` replays
correctly after each plan.

What it does not do: left padding (a row's keys must start at slot 0), sliding windows, soft-capping, sinks,
more than one query a row, and reading the length from a device scalar as our kernel does -- the host must
know each row's length before every step.
"""

from __future__ import annotations

import functools

import torch

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-K partial results)
CUDA_CORE_GROUPS = (1, 2, 3, 4, 8)  # query heads a KV head FlashInfer's CUDA-core decode is built for (0.6.x)


@functools.lru_cache(maxsize=1)
def _flashinfer():
    """The flashinfer module, or the reason it does not import (a string)."""
    try:
        import flashinfer

        return flashinfer
    except Exception as err:  # noqa: BLE001  (missing, or built for another torch / CUDA)
        from ..extras import install_hint

        return f"flashinfer is not importable ({type(err).__name__}: {str(err)[:200]}); {install_hint('flashinfer')}"


def why_not(device: torch.device | str, head_dim: int, dtype: torch.dtype) -> str | None:
    """Why FlashInfer's decode cannot serve a cache of this head size and dtype on ``device``; None when it can."""
    if torch.device(device).type != "cuda":
        return f"FlashInfer runs on CUDA only, not {torch.device(device).type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"FlashInfer's decode takes float16 / bfloat16 caches, not {dtype}"
    if head_dim not in (64, 128, 256):
        return f"FlashInfer's decode is built for head sizes 64, 128 and 256, not {head_dim}"
    found = _flashinfer()
    return found if isinstance(found, str) else None


class PagedDecode:
    """Decode attention of one query a row over a static cache layer, by FlashInfer.

    Args:
        keys / values: one layer's cache, ``[rows, kv_heads, slots, dim]``, contiguous (the fast engine's layout).
        heads: query heads (a multiple of ``kv_heads``).
        tensor_cores: FlashInfer's tensor-core decode (the default: the faster of the two on every shape measured,
            and the only one for query groups of 5-7 heads a KV head) or its CUDA-core one (groups of
            :data:`CUDA_CORE_GROUPS`).
        cuda_graph: keep FlashInfer's index buffers fixed so that :meth:`run` can be captured.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, heads: int, tensor_cores: bool = True,
                 cuda_graph: bool = False):
        reason = why_not(keys.device, keys.shape[-1], keys.dtype)
        if reason is not None:
            raise RuntimeError(f"PagedDecode cannot run here: {reason}. Use hf_rstitch.fast.kernels.decode_attention "
                               "(the fast engine's default) instead.")
        if keys.shape != values.shape or not (keys.is_contiguous() and values.is_contiguous()):
            raise ValueError(f"PagedDecode needs contiguous keys and values of one shape [rows, kv_heads, slots, dim], "
                             f"got {tuple(keys.shape)} and {tuple(values.shape)}")
        group = heads // keys.shape[1]
        if heads % keys.shape[1] or (not tensor_cores and group not in CUDA_CORE_GROUPS):
            raise ValueError(f"PagedDecode: {heads} query heads over {keys.shape[1]} KV heads; FlashInfer's CUDA-core "
                             f"decode takes groups of {CUDA_CORE_GROUPS} query heads a KV head. Pass "
                             "tensor_cores=True (any whole group).")
        fi = _flashinfer()
        self.keys, self.values, self.heads = keys, values, heads
        rows, self.kv_heads, self.slots, self.dim = keys.shape
        device = keys.device
        self._indptr = torch.arange(rows + 1, dtype=torch.int32, device=device)  # page b is row b
        self._last = torch.zeros(rows, dtype=torch.int32, device=device)
        work = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        extra = dict(paged_kv_indptr_buffer=self._indptr, paged_kv_indices_buffer=self._indptr[:-1].clone(),
                     paged_kv_last_page_len_buffer=self._last) if cuda_graph else {}
        self._wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(work, "HND", use_cuda_graph=cuda_graph,
                                                              use_tensor_cores=tensor_cores, **extra)
        self._rows = 0

    def plan(self, lengths: list[int]) -> None:
        """Host work before a step: row ``b`` attends to its first ``lengths[b]`` slots (1..slots each)."""
        rows = len(lengths)
        if not 1 <= rows <= self.keys.shape[0] or not all(1 <= n <= self.slots for n in lengths):
            raise ValueError(f"PagedDecode.plan takes 1..{self.keys.shape[0]} lengths of 1..{self.slots} slots, "
                             f"got {lengths}")
        indptr = torch.arange(rows + 1, dtype=torch.int32)  # on the host: FlashInfer plans there, no device read
        last = torch.tensor(lengths, dtype=torch.int32)
        self._wrapper.plan(indptr, indptr[:-1], last, self.heads, self.kv_heads, self.dim, self.slots,
                           q_data_type=self.keys.dtype, kv_data_type=self.keys.dtype, sm_scale=self.dim ** -0.5)
        self._rows = rows

    def run(self, query: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """``query`` ``[b, H, 1, D]`` (as transformers hands it to an attention function) -> ``[b, 1, H, D]``."""
        b, heads, q_len, dim = query.shape
        if q_len != 1 or b != self._rows or heads != self.heads:
            raise ValueError(f"PagedDecode.run takes one query a row for the {self._rows} rows planned "
                             f"({self.heads} heads), got a query of shape {tuple(query.shape)}")
        if scale is not None and abs(scale - dim ** -0.5) > 1e-9:
            raise ValueError(f"PagedDecode plans the scale 1/sqrt({dim}); got {scale}. Use decode_attention.")
        out = self._wrapper.run(query[:, :, 0].contiguous(), (self.keys, self.values))  # [b, H, D]: pages 0..b-1
        return out[:, None]
