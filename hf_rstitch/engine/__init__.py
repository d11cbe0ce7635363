"""The stitched decode engine: one :class:`Lane` per model and the loop that alternates them.

The engine knows nothing about tokenizers, GenerationConfig or ``generate``; it works on
token-id tensors, a routing policy (:mod:`hf_rstitch.core.policies`), a logits processor
and a stopping rule. :mod:`hf_rstitch.hf` adapts it to transformers.
"""

from .lane import Lane
from .loop import StitchResult, stitch_loop
from .protocol import EagerEngine, LaneProtocol
from .requests import Completion, Event, QueueFull, Request, RequestEngine
from .step import Routing, StepOut, run_step

__all__ = ["Completion", "Event", "QueueFull", "Request", "RequestEngine", "EagerEngine", "Lane", "LaneProtocol", "Routing", "StepOut", "StitchResult", "run_step", "stitch_loop"]
