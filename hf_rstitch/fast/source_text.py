"""The source text of a modelling function, read once a process: what the patches compare to the reference forms
(Llama's RMSNorm and decoder layer, the MoE routers, a plain attention) to decide whether a kernel may stand in.

``inspect.getsource`` reads and tokenizes the function's file at every call; a lane asks it of every norm, layer
and attention module it patches (hundreds of calls a pair), so the text is kept per function object.
"""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def source(fn) -> str | None:
    """``inspect.getsource(fn)``, cached per function; None where Python cannot find it (built-ins, code made at
    run time)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None
