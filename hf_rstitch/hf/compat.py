"""Names that moved inside transformers 5.x, resolved once per model class.

transformers 5.24 renamed the model ``forward`` argument ``past_key_values`` to ``cache`` (the old
name warns, and goes in 5.40); 5.17-5.23 know only ``past_key_values``. Code outside the engine's
lanes that calls a model with a cache uses :func:`cache_kwarg` so it never passes a deprecated name.
"""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _forward_takes_cache(model_class: type) -> bool:
    return "cache" in inspect.signature(model_class.forward).parameters


def cache_kwarg(model) -> str:
    """``"cache"`` where the model's ``forward`` takes it (transformers >= 5.24), else ``"past_key_values"``."""
    return "cache" if _forward_takes_cache(type(model)) else "past_key_values"


def with_cache(model, cache) -> dict:
    """``{cache_kwarg(model): cache}``, to splat into a forward call."""
    return {cache_kwarg(model): cache}
