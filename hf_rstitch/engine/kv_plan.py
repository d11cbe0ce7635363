"""How long a request the fast engine's request lanes hold, and how many tokens of KV memory each paged pool gets.

Only :func:`hf_rstitch.engine.build` calls :func:`kv_plan`, for the fast engine serving requests (the eager lanes
grow their caches as rows write and have no pool).
"""

from __future__ import annotations

import logging

from .config import EngineConfig
from .pair import Pair

CPU_ROW_TOKENS = 4096  # KV tokens a row off CUDA (the fast engine's eager steps: tests and demos)
_serve_log = logging.getLogger("hf_rstitch.serve")


def kv_plan(pair: Pair, cfg: EngineConfig) -> tuple[int, int | None]:
    """``(max_length, kv_tokens)``: the longest prompt + new tokens a request may ask for (``cfg.max_length``, 0: the
    LLM's context window) and the tokens each paged KV pool holds (None: not paged). The pool is ``cfg.kv_tokens``
    if given; else sized from the GPU memory free now up to ``cfg.kv_memory`` of it
    (:func:`hf_rstitch.fast.kv_memory.kv_tokens_on_device`; off CUDA, where the fast engine only runs for tests,
    :data:`CPU_ROW_TOKENS` a row); with ``kv_memory`` None, every row's whole budget (``max_batch`` x
    ``max_length``). A request never needs more than a pool sized from memory: ``max_length`` is cut to it."""
    max_length = cfg.max_length or pair.context
    if not cfg.paged:
        return max_length, None
    if cfg.kv_tokens is not None:
        return max_length, cfg.kv_tokens
    if cfg.kv_memory is None:
        return max_length, cfg.max_batch * (max_length + cfg.spare_columns)
    if pair.device.type != "cuda":
        kv_tokens = cfg.max_batch * CPU_ROW_TOKENS
    else:
        from ..fast import kv_memory

        try:
            kv_tokens = kv_memory.kv_tokens_on_device(pair.llm, pair.slm, cfg.kv_memory)
        except ValueError:  # layers no paged cache holds (kv_shapes): the fast lanes refuse the pair when built
            return max_length, None
        if kv_tokens < 1:
            raise ValueError(f"no GPU memory is left for KV blocks below --kv-memory {cfg.kv_memory} once the pair "
                             "is loaded; raise --kv-memory, or serve smaller models / a lower precision")
        _serve_log.info("fast engine KV memory: %d tokens a model (%.1f rows of max_length %d); requests up to %d tokens",
                 kv_tokens, kv_tokens / max_length, max_length, min(max_length, kv_tokens))
    return min(max_length, kv_tokens), kv_tokens
