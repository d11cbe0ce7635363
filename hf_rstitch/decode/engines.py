"""The one engine resolver: which stitch engine a call runs, decided here and nowhere else.

``"default"``: the eager lanes (:class:`~hf_rstitch.decode.protocol.EagerEngine`: any device, any model).
``"fast"``: static caches and CUDA graphs (:mod:`hf_rstitch.fast`). ``"auto"``: the fast engine where it can
run the pair, the eager lanes otherwise, the reason logged (the fast engine's own check,
:func:`hf_rstitch.fast.choose_engine`). An engine argument left at ``None`` (``generate``'s ``stitch_engine``,
``RequestEngine(engine=...)``, ``rstitch eval`` / ``rstitch serve`` / ``rstitch generate --engine``) means
``"auto"``, unless the environment variable ``HF_RSTITCH_ENGINE`` names one of the three:
``HF_RSTITCH_ENGINE=default`` keeps every such call on the eager lanes. An engine the caller names always wins.

:func:`resolve_engine` turns a spec into the object that builds a pair's lanes (``generate``, the request
engine and ``rstitch eval`` call it); :func:`requested_engine` and :func:`engine_option` read a name (the CLI
configs: torch-free, this module imports the eager lanes only inside :func:`resolve_engine`). This layer does not
import the fast engine: a caller that runs it passes :func:`hf_rstitch.fast.fast_engine` in.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

ENGINE_NAMES = ("default", "fast", "auto")
ENGINE_ENV = "HF_RSTITCH_ENGINE"


def requested_engine(spec=None):
    """``spec`` itself unless it is None; else ``$HF_RSTITCH_ENGINE`` if set, else ``"auto"``."""
    if spec is not None:
        return spec
    value = os.environ.get(ENGINE_ENV, "").strip().lower()
    if not value:
        return "auto"
    if value not in ENGINE_NAMES:
        raise ValueError(f"{ENGINE_ENV}={os.environ[ENGINE_ENV]!r} names no stitch engine; expected one of "
                         f"{', '.join(ENGINE_NAMES)} (or unset it, which means auto).")
    return value


def engine_option(value, flag: str = "--engine") -> str:
    """A CLI config's engine name: :func:`requested_engine` of ``value``, which must be one of :data:`ENGINE_NAMES`."""
    name = requested_engine(value)
    if name not in ENGINE_NAMES:
        raise ValueError(f"{flag} must be default, fast or auto, got {name!r}.")
    return name


def is_eager(spec) -> bool:
    """Whether an engine spec names the eager lanes: ``"default"``, or a lane builder that builds them
    (:class:`~hf_rstitch.decode.protocol.EagerEngine`, whose ``eager`` is True)."""
    return (isinstance(spec, str) and spec == "default") or getattr(spec, "eager", False) is True


class Resolved(NamedTuple):
    """What :func:`resolve_engine` made of a spec: ``builder`` (``.lanes(llm, slm, vocab, batch, capacity,
    timing)``) and ``auto`` -- the spec was ``"auto"`` and the builder is the fast engine's, so a failure of its
    lanes falls back to the eager ones (:mod:`hf_rstitch.hf.fallback`, :mod:`hf_rstitch.fast.fallback_lanes`)."""

    builder: Any
    auto: bool

    @property
    def eager(self) -> bool:
        return is_eager(self.builder)


FastHook = Callable[..., Any]  # fast(llm, slm, spec, batch, own) -> a lane builder: hf_rstitch.fast.fast_engine


def resolve_engine(llm, slm, spec=None, batch: int = 1, own: bool = False, fast: FastHook | None = None) -> Resolved:
    """The one place a ``stitch_engine`` spec becomes the object that builds a pair's lanes.

    Args:
        spec: ``None`` (:func:`requested_engine`: ``$HF_RSTITCH_ENGINE``, else ``"auto"``), ``"default"`` or an
            :class:`~hf_rstitch.decode.protocol.EagerEngine` (the eager lanes), or ``"auto"``, ``"fast"``, a
            FastConfig or a FastEngine, which go to ``fast(llm, slm, spec, batch, own)``.
        batch: rows the lanes must hold (``"auto"`` checks the pair at this batch size).
        own: a fast engine of the caller's own for ``batch`` rows, not the one kept on the LLM (the request
            engine's and ``rstitch eval``'s).
        fast: :func:`hf_rstitch.fast.fast_engine`, passed in by a caller that runs the fast engine.
    """
    from .protocol import EagerEngine  # torch: here, not at import (the CLI configs import this module)

    spec = requested_engine(spec)
    if is_eager(spec):
        return Resolved(spec if isinstance(spec, EagerEngine) else EagerEngine(), False)
    if fast is None:
        raise ValueError(f"stitch_engine={spec!r} asks for the fast engine, which this caller does not run; "
                         "pass stitch_engine='default' (the eager lanes).")
    builder = fast(llm, slm, spec, batch, own)
    auto = isinstance(spec, str) and spec == "auto"
    return Resolved(builder, auto and not is_eager(builder))
