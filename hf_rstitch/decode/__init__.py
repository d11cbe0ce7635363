"""Stitched decoding: the lane protocol, the eager lane, one step and the loop.

The decode layer knows nothing about tokenizers, GenerationConfig, ``generate`` or requests; it works on
token-id tensors, a routing policy (:mod:`hf_rstitch.core.policies`), a logits processor and a stopping
rule. :mod:`hf_rstitch.hf` adapts it to transformers, :mod:`hf_rstitch.batching` runs a stream of requests
through it, :mod:`hf_rstitch.fast` is a second implementation of its lane protocol and :mod:`hf_rstitch.engine`
chooses and builds a pair's engine; it imports none of those. The names below load torch on first use only.
"""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"EagerEngine": ".protocol", "Lane": ".lane", "LaneProtocol": ".protocol", "Routing": ".step",
         "StepOut": ".step", "StitchResult": ".loop", "run_step": ".step",
         "stitch_loop": ".loop"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
