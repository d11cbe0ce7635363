"""FastEngine: owns the two FastLanes of a model pair and reuses them across generations.

Capturing graphs (and compiling, if asked) costs far more than one generation's worth of host
time, so lanes are kept: ``generate(..., stitch_engine=engine)`` with the same engine object
reuses its lanes (and their graphs) whenever the models, vocabulary width and configuration
match and the capacity suffices; otherwise the lane is rebuilt. ``stitch_engine="fast"``
builds a throw-away engine per call (capture cost paid every call).

The engine holds its models; drop it to free the caches and graphs.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ..core.roles import Role
from .lane import FastConfig, FastLane, check_supported


class FastEngine:
    """Builds (or reuses) ``{Role.SLM: FastLane, Role.LLM: FastLane}`` for stitched decoding.

    Args:
        config: :class:`FastConfig` shared by both lanes.
        capacity: minimum cache capacity in tokens; a generation needing more rebuilds its lanes.
    """

    def __init__(self, config: FastConfig | None = None, capacity: int = 0):
        self.config = config or FastConfig()
        self.capacity = capacity
        self._lanes: dict[Role, FastLane] = {}
        self.builds = 0  # lanes built so far (reuse check for tests and benchmarks)

    def lane(self, model: PreTrainedModel, role: Role, vocab: int, capacity: int, timing: bool = False) -> FastLane:
        lane = self._lanes.get(role)
        if (lane is None or lane.model is not model or lane.vocab != vocab or lane.capacity < capacity):
            self._lanes.pop(role, None)  # free the old buffers before allocating new ones
            lane = FastLane(model, role, vocab, max(capacity, self.capacity), self.config)
            self._lanes[role] = lane
            self.builds += 1
            if self.config.warm_up:  # every bucket now: no generation pays a capture or compile mid-way
                lane.warm_up()
        else:
            lane.reset()
        lane.timing = timing
        return lane

    def lanes(self, slm: PreTrainedModel, llm: PreTrainedModel, vocab: int, batch_size: int, capacity: int,
              timing: bool = False) -> dict[Role, FastLane]:
        check_supported(llm, batch_size)
        check_supported(slm, batch_size)
        return {
            Role.SLM: self.lane(slm, Role.SLM, vocab, capacity, timing),
            Role.LLM: self.lane(llm, Role.LLM, vocab, capacity, timing),
        }

    def capture_seconds(self) -> float:
        """Host seconds spent warming up and recording graphs (compilation included)."""
        return sum(l.graphs.capture_seconds for l in self._lanes.values() if l.graphs is not None)

    def graph_count(self) -> int:
        return sum(len(l.graphs.graphs) for l in self._lanes.values() if l.graphs is not None)


def resolve_engine(spec) -> FastEngine:
    """``"fast"`` -> a new FastEngine; a FastConfig -> a new engine with it; a FastEngine -> itself."""
    if isinstance(spec, FastEngine):
        return spec
    if isinstance(spec, FastConfig):
        return FastEngine(spec)
    if spec == "fast":
        return FastEngine()
    raise ValueError(
        f"stitch_engine must be 'default', 'fast', a hf_rstitch.fast.FastConfig or a hf_rstitch.fast.FastEngine, "
        f"got {spec!r}."
    )
