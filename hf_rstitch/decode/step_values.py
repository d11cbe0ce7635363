"""A request-engine step's values on their way to the host (:mod:`hf_rstitch.batching.requests`).

The step's tokens, entropies and hand-back decisions come back in one device-to-host copy
(:func:`hf_rstitch.decode.step.send_to_host`). It is queued as soon as they exist, before the next
step's early lane call (run-ahead), and awaited after it, so the wait does not wait for that call.
"""

from __future__ import annotations

import torch

from .step import on_host, send_to_host


def send_values(tokens, entropy, slm_h, back, wide: bool = False):
    """Tokens, entropies and the hand-back decisions packed into one tensor, its copy to the host queued now.

    One ``cat`` packs them: type promotion makes it float32 (the entropies' dtype), exact for the decisions and
    for token ids below 2**24; ``wide`` (a vocabulary past that) packs float64 instead."""
    if entropy.dtype not in (torch.float32, torch.float64):  # a half dtype would not hold the ids
        entropy = entropy.float()
    parts = [tokens.double() if wide else tokens, entropy]
    if slm_h is not None:
        parts.append(slm_h.to(tokens.device))
    kept = back.clone() if back is not None and back.device.type == "cpu" else None  # decided on the host: there
    # (a blocking copy to the device would wait for every kernel queued)
    if back is not None and kept is None:
        parts.append(back.to(tokens.device))
    return send_to_host(torch.cat(parts)), len(tokens), slm_h is not None, back is not None, kept


def receive_values(pending):
    """The values :func:`send_values` queued, once on the host: ``(tokens, entropy, slm_h, back)``."""
    copy, n, with_slm, with_back, kept = pending
    flat = on_host(copy)
    tok, ent = flat[:n].long(), flat[n: 2 * n]
    rest = flat[2 * n:]
    sh = rest[:n] if with_slm else None
    bk = kept if kept is not None else (rest[n:] if with_slm else rest[:n]).bool() if with_back else None
    return tok, ent, sh, bk
