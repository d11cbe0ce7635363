"""From a user's ``generate(...)`` call to stitched decoding, shared by the ``generate`` patch and
the exported Hub template: the SLM and the streamer are handed to the ``custom_generate`` callable
under names transformers forwards, and stop strings become a stopping criterion while the
tokenizer is still at hand (transformers drops it on the way to a callable)."""

from __future__ import annotations

from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from .checks import check_tokenizers
from .decode import stitched_decode
from .settings import check_settings, configured_router, configured_slm


def stop_string_criteria(model, kwargs: dict, tokenizer) -> None:
    """Move ``stop_strings`` (argument or generation config) into ``kwargs["stopping_criteria"]``."""
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


def run_stitched(generate, model, args: tuple, kwargs: dict):
    """Call transformers' ``generate`` with :func:`stitched_decode` as its ``custom_generate``.

    ``assistant_model`` (or ``stitch_slm``, else the generation config's ``stitch_slm_name_or_path``) is
    the SLM; a router named by the generation config applies when no policy or router is passed
    (:mod:`hf_rstitch.hf.settings`); every other argument passes through.
    """
    config = kwargs.get("generation_config") or model.generation_config
    check_settings(config)
    slm = kwargs.pop("assistant_model", None)
    fallback = kwargs.pop("stitch_slm", None)
    if slm is None and fallback is None:
        fallback = configured_slm(model, config)
    if kwargs.get("stitch_policy") is None and kwargs.get("stitch_router") is None and configured_router(config):
        kwargs["stitch_router"] = configured_router(config)
    tokenizer = kwargs.pop("tokenizer", None)
    check_tokenizers(tokenizer, kwargs.pop("assistant_tokenizer", None))
    stop_string_criteria(model, kwargs, tokenizer)
    kwargs["custom_generate"] = stitched_decode
    return generate(model, *args, stitch_slm=slm if slm is not None else fallback,
                    stitch_streamer=kwargs.get("streamer"), **kwargs)
