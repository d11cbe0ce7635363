"""The stitch engines a caller can name, and which one runs when the caller names none.

``"default"``: the eager lanes (any device, any model). ``"fast"``: static caches and CUDA graphs
(:mod:`hf_rstitch.fast`). ``"auto"``: the fast engine where it can run the pair, the eager lanes
otherwise, the reason logged (:func:`hf_rstitch.fast.choose_engine`). An engine argument left at
``None`` (``generate``'s ``stitch_engine``, ``RequestEngine(engine=...)``, ``rstitch eval`` /
``rstitch serve --engine``) means ``"auto"``, unless the environment variable ``HF_RSTITCH_ENGINE``
names one of the three: ``HF_RSTITCH_ENGINE=default`` keeps every such call on the eager lanes.
An engine the caller names always wins over the variable. Torch-free: the CLI configs read it.
"""

from __future__ import annotations

import os

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
