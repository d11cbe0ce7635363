"""The fast engine's half of engine resolution: what :func:`hf_rstitch.decode.protocol.resolve_engine` (the
one resolver) hands any spec that does not name the eager lanes, when its caller offers the fast engine.

``"auto"`` is decided by :func:`hf_rstitch.fast.engine.choose_engine` (the eager lanes where the fast engine
cannot run the pair); ``"fast"`` and a :class:`FastConfig` become a :class:`FastEngine`.
"""

from __future__ import annotations

from ..decode.protocol import EagerEngine, LaneBuilder, is_eager
from .config import FastConfig
from .engine import FastEngine, choose_engine, engine_for


def fast_engine(llm, slm, spec, batch: int = 1, own: bool = False) -> LaneBuilder:
    """The lane builder (``.lanes(llm, slm, vocab, batch, capacity, timing)``) that runs ``spec`` for this pair.

    Args:
        spec: ``"auto"`` (:func:`choose_engine`), ``"fast"``, a :class:`FastConfig` or a :class:`FastEngine`.
        batch: rows the lanes must hold (``"auto"`` checks the pair at this batch size).
        own: a fast spec gets a new :class:`FastEngine` for ``batch`` rows (the request engine keeps its
            own); without it, the engine kept on the LLM for that configuration (:func:`engine_for`), which
            later ``generate`` calls reuse.
    """
    spec = choose_engine(llm, slm, spec, batch)
    if is_eager(spec):
        return spec if isinstance(spec, EagerEngine) else EagerEngine()
    if isinstance(spec, FastEngine):
        return spec
    if isinstance(spec, str) and spec == "fast":
        spec = FastConfig()
    if not isinstance(spec, FastConfig):
        raise ValueError(
            f"stitch_engine must be None, 'auto', 'default', 'fast', a hf_rstitch.fast.FastConfig, a "
            f"hf_rstitch.fast.FastEngine or a hf_rstitch.decode.EagerEngine, got {spec!r}.")
    return FastEngine(spec, max_batch=batch) if own else _EngineOnModel(spec)


class _EngineOnModel:
    """A FastConfig for ``generate``: the LLM's own engine for that configuration, made on first use."""

    single_device = True

    def __init__(self, config: FastConfig):
        self.config = config

    def __repr__(self) -> str:
        return repr(self.config)

    def lanes(self, llm, slm, vocab, batch_size, capacity, timing=False) -> dict:
        return engine_for(llm, self.config).lanes(llm, slm, vocab, batch_size, capacity, timing)
