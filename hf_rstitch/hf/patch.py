"""The reversible ``generate`` patch: ``generate(..., assistant_model=slm, stitch_threshold=tau)``.

Only calls that ask for stitching (``stitch_threshold`` / ``stitch_policy`` as an argument or
``stitch_threshold`` on the generation config) are rerouted -- through transformers' own
``custom_generate`` hook, so all of generate's preparation still runs. Every other call,
HF's assisted generation included, goes to the original ``generate`` untouched.
"""

from __future__ import annotations

import functools

_ORIGINAL_GENERATE = None
_STITCH_ARGS = ("stitch_threshold", "stitch_policy", "stitch_router")


def _wants_stitching(model, kwargs: dict) -> bool:
    if any(kwargs.get(name) is not None for name in _STITCH_ARGS):
        return True
    config = kwargs.get("generation_config") or model.generation_config
    return getattr(config, "stitch_threshold", None) is not None


def _stitching_generate(self, *args, **kwargs):
    from .decode import stitched_decode  # loaded at the first call, not when generate is patched
    from .entry import run_stitched

    custom = kwargs.get("custom_generate")
    if not _wants_stitching(self, kwargs) or (custom is not None and custom is not stitched_decode):
        # another custom_generate (e.g. the exported Hub template) receives the stitch_* arguments itself
        return _ORIGINAL_GENERATE(self, *args, **kwargs)
    return run_stitched(_ORIGINAL_GENERATE, self, args, kwargs)


def _generation_mixin():
    # imported here, not at the top: importing it may run hf.deferred's pending patch, which imports this module
    from transformers.generation.utils import GenerationMixin

    return GenerationMixin


def patch() -> None:
    """Route stitching requests of ``GenerationMixin.generate`` to R-Stitch (idempotent)."""
    GenerationMixin = _generation_mixin()
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is not None:
        return
    _ORIGINAL_GENERATE = GenerationMixin.generate
    GenerationMixin.generate = functools.wraps(_ORIGINAL_GENERATE)(_stitching_generate)


def unpatch() -> None:
    """Restore transformers' own ``generate`` (idempotent)."""
    GenerationMixin = _generation_mixin()
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is None:
        return
    GenerationMixin.generate = _ORIGINAL_GENERATE
    _ORIGINAL_GENERATE = None


def is_patched() -> bool:
    """Whether ``generate`` is patched now (after ``import hf_rstitch``: once transformers has loaded)."""
    return _ORIGINAL_GENERATE is not None
