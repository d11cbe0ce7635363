"""The reversible ``generate`` patch: ``generate(..., assistant_model=slm, stitch_threshold=tau)``.

Only calls that ask for stitching (``stitch_threshold`` / ``stitch_policy`` as an argument or
``stitch_threshold`` on the generation config) are rerouted -- through transformers' own
``custom_generate`` hook, so all of generate's preparation still runs. Every other call,
HF's assisted generation included, goes to the original ``generate`` untouched.
"""

from __future__ import annotations

import functools

from transformers import GenerationMixin, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from .checks import check_tokenizers
from .decode import stitched_decode

_ORIGINAL_GENERATE = None
_STITCH_ARGS = ("stitch_threshold", "stitch_policy", "stitch_router")


def _wants_stitching(model, kwargs: dict) -> bool:
    if any(kwargs.get(name) is not None for name in _STITCH_ARGS):
        return True
    config = kwargs.get("generation_config") or model.generation_config
    return getattr(config, "stitch_threshold", None) is not None


def _stop_string_criteria(model, kwargs: dict, tokenizer) -> None:
    """transformers loses `tokenizer` on the way to a custom_generate callable, so stop strings
    are turned into a stopping criterion here, where the tokenizer is still at hand."""
    config = kwargs.get("generation_config") or model.generation_config
    stop = kwargs.pop("stop_strings", None) or getattr(config, "stop_strings", None)
    if not stop:
        return
    if tokenizer is None:
        raise ValueError("`stop_strings` needs the tokenizer: pass `tokenizer=tok` to generate().")
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop))
    kwargs["stopping_criteria"] = criteria
    kwargs["stop_strings"] = None


def _stitching_generate(self, *args, **kwargs):
    custom = kwargs.get("custom_generate")
    if not _wants_stitching(self, kwargs) or (custom is not None and custom is not stitched_decode):
        # another custom_generate (e.g. the exported Hub template) receives the stitch_* arguments itself
        return _ORIGINAL_GENERATE(self, *args, **kwargs)
    slm = kwargs.pop("assistant_model", None)
    if slm is None:
        slm = kwargs.pop("stitch_slm", None)
    tokenizer = kwargs.pop("tokenizer", None)
    check_tokenizers(tokenizer, kwargs.pop("assistant_tokenizer", None))
    _stop_string_criteria(self, kwargs, tokenizer)
    kwargs["custom_generate"] = stitched_decode
    return _ORIGINAL_GENERATE(self, *args, stitch_slm=slm, stitch_streamer=kwargs.get("streamer"), **kwargs)


def patch() -> None:
    """Route stitching requests of ``GenerationMixin.generate`` to R-Stitch (idempotent)."""
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is not None:
        return
    _ORIGINAL_GENERATE = GenerationMixin.generate
    GenerationMixin.generate = functools.wraps(_ORIGINAL_GENERATE)(_stitching_generate)


def unpatch() -> None:
    """Restore transformers' own ``generate`` (idempotent)."""
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is None:
        return
    GenerationMixin.generate = _ORIGINAL_GENERATE
    _ORIGINAL_GENERATE = None


def is_patched() -> bool:
    return _ORIGINAL_GENERATE is not None
