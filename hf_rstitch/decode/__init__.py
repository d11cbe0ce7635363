"""Stitched decoding: the lane protocol, the eager lane, one step, the loop, and the one engine resolver.

The decode layer knows nothing about tokenizers, GenerationConfig, ``generate`` or requests; it works on
token-id tensors, a routing policy (:mod:`hf_rstitch.core.policies`), a logits processor and a stopping
rule. :mod:`hf_rstitch.hf` adapts it to transformers, :mod:`hf_rstitch.serving` runs a stream of requests
through it, and :mod:`hf_rstitch.fast` is a second implementation of its lane protocol. It imports
nothing of those.
"""

from .lane import Lane
from .loop import StitchResult, stitch_loop
from .protocol import EagerEngine, LaneProtocol
from .step import Routing, StepOut, run_step

__all__ = ["EagerEngine", "Lane", "LaneProtocol", "Routing", "StepOut", "StitchResult", "run_step", "stitch_loop"]
