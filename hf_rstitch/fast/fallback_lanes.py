"""The request engine's lanes under ``"auto"``: the fast engine's, or the eager ones when the fast lanes fail.

``generate`` reruns a call on the eager engine when the fast one fails (:mod:`hf_rstitch.hf.fallback`); a
request engine (``rstitch serve --engine auto``) cannot rerun requests whose tokens it already streamed, so
it proves its fast lanes before it takes any: :func:`lanes` builds them and warms them up at their smallest
batch bucket (every length bucket captured, and compiled where the configuration compiles: the failures a
model's architecture brings -- a capture that reads the host, a lowering error, a missing attribute -- show
there). Any exception in that falls back to the eager lanes with one logged warning (on ``hf_rstitch.fast``)
and the pair is remembered as failed (:func:`.support.remember_failure`: later ``"auto"`` calls of the pair,
``generate`` included, go to the eager engine directly). A fast engine the caller named (``"fast"``, a
FastConfig or FastEngine) is never replaced: its errors are raised, and it is not warmed up here.

What it does not do: a failure after the warm-up (a later batch bucket's capture) fails the step it happens
in, as any failed step does (the running requests end with an ``error`` event; :mod:`hf_rstitch.serving.requests`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("hf_rstitch.fast")


def lanes(llm, slm, engine, vocab: int, batch: int, capacity: int, auto: bool, **kwargs) -> dict | None:
    """``engine.lanes(..., **kwargs)`` for the pair, warmed up when ``auto``; None where ``auto`` picked the fast engine and
    building or warming its lanes raised (the reason logged once): the caller runs the eager lanes."""
    from . import support
    from .engine import FastEngine

    if not auto:
        return engine.lanes(llm, slm, vocab, batch, capacity, **kwargs)
    try:
        built = engine.lanes(llm, slm, vocab, batch, capacity, **kwargs)
        if not (isinstance(engine, FastEngine) and engine.config.warm_up):  # else warmed whole as they were built
            for lane in built.values():
                lane.warm_up(batch_sizes=[min(lane.rows.sizes)])
        return built
    except Exception as err:  # noqa: BLE001  (any failure of the fast lanes: the eager lanes serve the pair)
        text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        reason = f"{type(err).__name__}: {text}"
        support.remember_failure(llm, slm, reason)
        log.warning("hf_rstitch: the fast engine failed on this pair while its lanes were built or warmed up (%s); "
                    "the request engine serves it on the eager engine, and later stitch_engine='auto' calls of the "
                    "pair go there directly", reason)
        return None
