"""``stitch_engine="auto"`` never fails where the eager engine works: a fast-engine failure reruns the call eagerly.

When ``"auto"`` picked the fast engine and building its lanes, capturing a graph, compiling or any step of
the fast run raises, :func:`run_with_fallback` logs one warning (on ``hf_rstitch.fast``) with the
reason, remembers the pair as failed (:func:`hf_rstitch.fast.support.remember_failure`: later ``"auto"``
calls of the pair go to the eager engine directly), drops the fast engine kept on the LLM (its buffers
and graphs) and reruns the whole call on the eager engine, from the RNG state the call started with:
sampled tokens are drawn as they would have been had the eager engine run from the start.

Streaming: tokens already put into the streamer stay put. The eager rerun puts only the steps past
those (the consumer sees each step once). Where the fast run had streamed steps whose tokens the eager
engine then draws differently (possible in bfloat16, where the engines' rounding differs; never in
float32, where the zoo suite proves them equal), the streamed text and the returned sequences differ in
those first steps: the returned sequences are the eager engine's. A name the caller gave
(``stitch_engine="fast"``, a FastConfig or FastEngine) is never replaced: its errors are raised.
"""

from __future__ import annotations

import logging

import torch

from ..decode.protocol import EagerEngine

log = logging.getLogger("hf_rstitch.fast")


def run_with_fallback(llm, slm, engine, attempt):
    """``attempt(engine, skip)`` (``skip``: streamed steps not to put again) on the fast ``engine`` that
    ``"auto"`` picked; on any exception, once more on ``"default"`` (see the module docstring)."""
    from ..fast import support
    from ..fast.engine import ATTRIBUTE

    state = rng_state(llm.device)
    streamed = [0]
    try:
        return attempt(engine, 0, streamed)
    except Exception as err:  # noqa: BLE001  (any failure of the fast path: the eager engine decides)
        text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        reason = f"{type(err).__name__}: {text}"
        support.remember_failure(llm, slm, reason)
        llm.__dict__.get(ATTRIBUTE, {}).pop(getattr(engine, "config", engine), None)  # free its caches and graphs
        log.warning("hf_rstitch: the fast engine failed on this pair (%s); this call reruns on the eager engine "
                    "(%d streamed steps kept), and later stitch_engine='auto' calls of the pair go there "
                    "directly", reason, streamed[0])
        restore_rng(state)
        return attempt(EagerEngine(), streamed[0], [0])


def rng_state(device: torch.device):
    """The RNG states a sampled generation draws from: the CPU's and ``device``'s (CUDA)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, device


def restore_rng(state) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
