"""Stitching settings stored on the LLM's generation config, so they travel with the checkpoint.

Three custom entries of ``llm.generation_config`` (saved to ``generation_config.json``):

* ``stitch_threshold``: tau. With it set, ``llm.generate(...)`` stitches without being asked.
* ``stitch_slm_name_or_path``: the SLM as a Hub id or local folder, loaded on first use when
  ``generate`` gets no ``assistant_model`` (same dtype and device as the LLM, cached per LLM).
* ``stitch_router_name_or_path``: an R-Stitch+ router (Hub id, folder or ``"shipped"``), used when
  ``generate`` gets neither ``stitch_router`` nor ``stitch_policy``.

The references are not named ``stitch_slm`` / ``stitch_router``: transformers' ``generate`` moves an
argument into the generation config when the config has an entry of that name, and the objects
passed as arguments would then never reach the decoding function. :func:`configure` writes the
entries; :mod:`hf_rstitch.hf.persist` keeps them through ``save_pretrained`` / ``from_pretrained``.
This module is also flattened into the Hub template, so it needs only transformers.
"""

from __future__ import annotations

import math
import weakref

THRESHOLD_KEY = "stitch_threshold"
SLM_KEY = "stitch_slm_name_or_path"
ROUTER_KEY = "stitch_router_name_or_path"
SETTING_KEYS = (THRESHOLD_KEY, SLM_KEY, ROUTER_KEY)
# tau when neither the caller nor the LLM's generation config sets one: the paper's, and the one
# `rstitch tune` picks for the shipped pair on its valid split
# (benchmarks/results/toyworld_valid_threshold_sweep_stage2.json)
DEFAULT_THRESHOLD = 0.02
# generate() arguments that must not be generation-config entries (see the module docstring)
ARGUMENT_NAMES = {"stitch_slm": SLM_KEY, "stitch_router": ROUTER_KEY, "stitch_policy": None}

_LOADED_SLMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # llm -> {reference: slm}


def check_settings(config) -> None:
    """Refuse generation-config entries that would swallow ``generate``'s object arguments."""
    for name, instead in ARGUMENT_NAMES.items():
        if getattr(config, name, None) is not None:
            fix = f"store a Hub id or folder as generation_config.{instead}" if instead else "pass it to generate()"
            raise ValueError(
                f"generation_config.{name} is set; transformers would then capture generate's `{name}` argument "
                f"into the config and the stitched decoder would never see it. Delete it and {fix}."
            )


def validate_settings(config) -> None:
    """The checks ``GenerationConfig.validate`` runs on the stitching entries (hooked by :mod:`.persist`): tau in
    [0, 1], references as strings, no entry that would swallow a ``generate`` argument."""
    check_settings(config)
    tau = getattr(config, THRESHOLD_KEY, None)
    if tau is not None:
        threshold_value(tau)
    for key in (SLM_KEY, ROUTER_KEY):
        ref = getattr(config, key, None)
        if ref is not None and not isinstance(ref, str):
            raise ValueError(f"generation_config.{key} must be a Hub id or folder (a string), got "
                             f"{type(ref).__name__}; pass loaded objects to generate() instead.")


def threshold_value(value) -> float:
    """``value`` as a float in [0, 1], or a ValueError that says so."""
    try:
        tau = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"stitch threshold must be a number in [0, 1], got {value!r}.") from None
    if not (math.isfinite(tau) and 0.0 <= tau <= 1.0):
        raise ValueError(f"stitch threshold must be in [0, 1] (a normalized entropy), got {value!r}.")
    return tau


def default_threshold(config=None, given: float | None = None) -> float:
    """The one default tau: ``given`` when set, else the generation config's ``stitch_threshold`` (a model
    tuned with ``rstitch tune --write-config``), else :data:`DEFAULT_THRESHOLD`."""
    if given is not None:
        return threshold_value(given)
    tau = getattr(config, THRESHOLD_KEY, None) if config is not None else None
    return threshold_value(tau) if tau is not None else DEFAULT_THRESHOLD


def configured_slm(llm, config):
    """The SLM named by ``config.stitch_slm_name_or_path``, loaded once per LLM; None if unnamed."""
    ref = getattr(config, SLM_KEY, None)
    if ref is None:
        return None
    loaded = _LOADED_SLMS.setdefault(llm, {})
    if ref not in loaded:
        from transformers import AutoModelForCausalLM

        source = str(ref)
        if source.startswith("shipped:"):  # a file of the installed hf-rstitch (configure stores this, not its path)
            from ..resources import resolve

            source = resolve(source)
        try:
            slm = AutoModelForCausalLM.from_pretrained(source, dtype=llm.dtype)
        except OSError as err:
            raise OSError(
                f"generation_config.{SLM_KEY} = {ref!r} names the SLM, but it could not be loaded ({err}). "
                "Give a Hub id or a local folder that exists, or pass assistant_model=slm to generate()."
            ) from err
        loaded[ref] = slm.to(llm.device).eval()
    return loaded[ref]


def configured_router(config):
    """The router reference stored on the config (Hub id, folder or ``"shipped"``), or None."""
    return getattr(config, ROUTER_KEY, None)


def configure(model, threshold: float | None = None, slm=None, router=None):
    """Store stitching settings on ``model.generation_config`` so they survive ``save_pretrained``.

    Args:
        model: the LLM.
        threshold: tau in [0, 1]; with it set, plain ``model.generate(...)`` stitches.
        slm: the SLM as a Hub id or local folder (``str`` or ``Path``; or a loaded model: its ``name_or_path``
            is stored). A shipped asset (``hf_rstitch.shipped("slm")``) is stored as ``"shipped:slm"``, not as
            a path into this install.
        router: an R-Stitch+ router as a Hub id, local folder or ``"shipped"``.

    Returns the generation config. Also marks it as not derived from the model config (its
    ``_from_model_config`` would make ``from_pretrained`` drop the entries).
    """
    config = model.generation_config
    if threshold is not None:
        setattr(config, THRESHOLD_KEY, threshold_value(threshold))
    if slm is not None:
        setattr(config, SLM_KEY, _slm_reference(slm))
    if router is not None:
        if not isinstance(router, str):
            raise TypeError(f"`router` must be a Hub id, folder or 'shipped' (a string), got {type(router).__name__}; "
                            "save a Router with router.save_pretrained(DIR) and pass DIR.")
        setattr(config, ROUTER_KEY, router)
    config._from_model_config = False
    return config


def _slm_reference(slm) -> str:
    """What ``configure`` stores for ``slm``: a Hub id or folder (``str`` or ``os.PathLike``, e.g.
    ``hf_rstitch.shipped("slm")``) or a loaded model's ``name_or_path``; a shipped asset as ``shipped:NAME``."""
    import os

    ref = os.fspath(slm) if isinstance(slm, (str, os.PathLike)) else getattr(slm, "name_or_path", "")
    if not ref:
        raise ValueError(f"`slm` must be a Hub id, a folder (str or Path) or a loaded model with a name_or_path; "
                         f"got {type(slm).__name__} without one. Save it (slm.save_pretrained(DIR)) and pass DIR.")
    from ..resources import reference

    return reference(ref)


def clear_settings(config) -> dict:
    """Unset the stitching entries of ``config`` (harnesses that pass every setting explicitly); returns them."""
    found = stitch_settings(config)
    for key in found:
        setattr(config, key, None)
    return found


def stitch_settings(config) -> dict:
    """The stitching entries set on a generation config, e.g. ``{"stitch_threshold": 0.005}``."""
    return {k: getattr(config, k) for k in SETTING_KEYS if getattr(config, k, None) is not None}
