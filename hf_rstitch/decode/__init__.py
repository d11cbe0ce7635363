"""Stitched decoding: the lane protocol, the eager lane, one step, the loop, and the one engine resolver.

The decode layer knows nothing about tokenizers, GenerationConfig, ``generate`` or requests; it works on
token-id tensors, a routing policy (:mod:`hf_rstitch.core.policies`), a logits processor and a stopping
rule. :mod:`hf_rstitch.hf` adapts it to transformers, :mod:`hf_rstitch.serving` runs a stream of requests
through it, and :mod:`hf_rstitch.fast` is a second implementation of its lane protocol; it imports none of
those. The names below load torch on first use only, so :mod:`hf_rstitch.decode.engines` (which the CLI
configs read) stays torch-free.
"""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"EagerEngine": ".protocol", "Lane": ".lane", "LaneProtocol": ".protocol", "Routing": ".step",
         "StepOut": ".step", "StitchResult": ".loop", "resolve_engine": ".engines", "run_step": ".step",
         "stitch_loop": ".loop"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
