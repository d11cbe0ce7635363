"""The stitched decode engine: one :class:`Lane` per model and the loop that alternates them.

The engine knows nothing about tokenizers, GenerationConfig or ``generate``; it works on
token-id tensors, a routing policy (:mod:`hf_rstitch.core.policies`), a logits processor
and a stopping rule. :mod:`hf_rstitch.hf` adapts it to transformers.
"""

from .lane import Lane
from .loop import StitchResult, stitch_loop

__all__ = ["Lane", "StitchResult", "stitch_loop"]
