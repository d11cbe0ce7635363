"""A request-engine step's values on their way to the host (:mod:`hf_rstitch.engine.requests`).

The step's tokens, entropies and hand-back decisions come back in one device-to-host copy. It is queued
as soon as they exist, before the next step's early lane call (run-ahead), and awaited after it: on
CUDA into page-locked memory with an event recorded after the copy, so the wait does not wait for
the early call.
"""

from __future__ import annotations

import torch


def send_to_host(tokens, entropy, slm_h, back):
    """Tokens, entropies and the hand-back decisions on their way to the host in one copy, queued now: on CUDA
    into page-locked memory with an event after it, so that :func:`on_host` waits for the kernels queued
    before it, not for an early lane call queued after it."""
    parts = [tokens.double(), entropy.double()]
    if slm_h is not None:
        parts.append(slm_h.double().to(tokens.device))
    if back is not None:
        parts.append(back.double().to(tokens.device))
    flat, event = torch.cat(parts), None
    if flat.device.type == "cuda":
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(flat.device))
        flat = host
    return flat.cpu(), event, len(tokens), slm_h is not None, back is not None


def on_host(pending):
    """The values :func:`send_to_host` queued, once there: ``(tokens, entropy, slm_h, back)``."""
    flat, event, n, with_slm, with_back = pending
    if event is not None:
        event.synchronize()
    tok, ent = flat[:n].long(), flat[n: 2 * n]
    rest = flat[2 * n:]
    sh = rest[:n] if with_slm else None
    bk = (rest[n:] if with_slm else rest[:n]).bool() if with_back else None
    return tok, ent, sh, bk
