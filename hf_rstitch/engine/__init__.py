"""A pair's engine: which one runs it, and how it is built -- the one home of that question.

Between the decode layer and the fast engine (below) and ``generate``, the request engine and ``rstitch eval``
(above), which each build once and hand the built :class:`Engine` down:

* :class:`Pair` -- the two models, checked to stitch, with their shared vocabulary, end / pad ids and device;
* :class:`EngineConfig` -- what is asked for: the kind (``default``, ``fast``, ``auto``), the FastConfig, the
  sizes (max batch, max length, KV memory and tokens, paged, prefill chunk); torch-free, embedded whole by
  ``ServeConfig`` and ``EvalConfig``;
* :func:`choose` -- ``(kind, reason, ...)``: every rule of which engine runs (:mod:`.build`);
* :func:`build` -- the :class:`Engine`: lane builder, KV plan, warm-up, and the one fallback.

What it does not do: decode (:mod:`hf_rstitch.decode`), know transformers' ``generate`` or HTTP.
The names below load torch on first use only (:mod:`.config` is what the CLI configs read).
"""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"Choice": ".engine", "Engine": ".engine", "EngineConfig": ".config", "Pair": ".pair", "build": ".engine",
         "choose": ".engine"}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
