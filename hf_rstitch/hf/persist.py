"""Stitching settings survive ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``.

transformers drops custom entries of a generation config when its file says
``"_from_model_config": true`` -- the case of every model whose generation config was derived from
its model config, the shipped pair included. Small reversible hooks on ``GenerationConfig``,
installed by ``import hf_rstitch``:

* ``save_pretrained`` (which ``model.save_pretrained`` and ``push_to_hub`` call): a config that
  carries stitching settings is written with ``"_from_model_config": false``, so any transformers,
  with or without hf-rstitch, keeps them when loading (the Hub template relies on this);
* ``from_dict`` (which ``from_pretrained`` calls): stitching entries of a file still marked
  ``true`` (saved without this hook) are put back;
* ``validate`` (which transformers runs when a config is built, updated by ``generate``'s arguments
  and saved): the stitching entries are checked where transformers checks its own, so
  ``stitch_threshold=5.0`` fails there, not only later in ``generate``.

The wrappers keep transformers' names, docstrings and signatures (``functools.wraps``). Nothing else
about generation configs changes. :func:`unhook` removes all three (only while they are the
outermost wrappers: a hook another library installed later is left alone).
"""

from __future__ import annotations

import functools

from transformers import GenerationConfig

from .settings import SETTING_KEYS, stitch_settings, validate_settings

_MARK = "__rstitch_original__"


def _wrap_save(original):
    @functools.wraps(original)  # name, docstring and (through __wrapped__) signature stay transformers'
    def save_pretrained(self, *args, **kwargs):
        if stitch_settings(self) and self._from_model_config:
            self._from_model_config = False  # it now holds more than the model config's values
        return original(self, *args, **kwargs)

    setattr(save_pretrained, _MARK, original)
    return save_pretrained


def _wrap_from_dict(original):
    @functools.wraps(original)
    def from_dict(cls, config_dict, **kwargs):
        kept = {k: config_dict[k] for k in SETTING_KEYS if config_dict.get(k) is not None}
        out = original(cls, config_dict, **kwargs)
        config = out[0] if isinstance(out, tuple) else out
        for key, value in kept.items():
            if getattr(config, key, None) is None:
                setattr(config, key, value)
        return out

    setattr(from_dict, _MARK, original)
    return classmethod(from_dict)


def _wrap_validate(original):
    @functools.wraps(original)
    def validate(self, *args, **kwargs):
        validate_settings(self)
        return original(self, *args, **kwargs)

    setattr(validate, _MARK, original)
    return validate


def is_hooked() -> bool:
    return hasattr(GenerationConfig.save_pretrained, _MARK)


def hook() -> None:
    """Install both hooks (idempotent; reloading this module does not stack them)."""
    if is_hooked():
        return
    GenerationConfig.save_pretrained = _wrap_save(GenerationConfig.save_pretrained)
    GenerationConfig.from_dict = _wrap_from_dict(GenerationConfig.__dict__["from_dict"].__func__)
    if not hasattr(GenerationConfig.validate, _MARK):
        GenerationConfig.validate = _wrap_validate(GenerationConfig.validate)


def unhook() -> None:
    """Restore ``GenerationConfig.save_pretrained`` and ``from_dict`` (idempotent)."""
    current = GenerationConfig.save_pretrained
    if hasattr(current, _MARK):
        GenerationConfig.save_pretrained = getattr(current, _MARK)
    current = GenerationConfig.__dict__["from_dict"].__func__
    if hasattr(current, _MARK):
        GenerationConfig.from_dict = classmethod(getattr(current, _MARK))
    if hasattr(GenerationConfig.validate, _MARK):
        GenerationConfig.validate = getattr(GenerationConfig.validate, _MARK)
