"""One config dataclass embedded whole in another, its fields still taken flat.

``ServeConfig`` holds an ``EngineConfig`` (``engine``) and an ``HttpConfig`` (``http``), ``EvalConfig`` an
``EngineConfig``: each part is handed on as one object (``build(pair, cfg.engine)``, the app's ``settings.http``),
while the Python API and the CLI keep every field's flat name (``ServeConfig(max_batch=4, header_timeout=5)``,
``--max-batch``, ``--header-timeout``). :func:`embeds` is the Python side; the CLI side is
:func:`hf_rstitch.cli.args.add_dataclass_args` (a field with ``metadata={"embed": True}``). Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping


def help_meta(text: str, **extra: Any) -> dict:
    """A config field's metadata: its ``--help`` text, and ``extra`` keys for the CLI (``flag=``, ``choices=``,
    ``cli=False``: :func:`hf_rstitch.cli.args.add_dataclass_args`)."""
    return {"help": text, **extra}


def embeds(name: str, inner: type, aliases: Mapping[str, str] | None = None, **defaults: Any):
    """Class decorator for a config dataclass whose field ``name`` holds an ``inner`` dataclass whole.

    Its constructor also takes ``inner``'s fields flat -- under their own names, or under a key of ``aliases``
    (``{"max_model_len": "max_length"}``) -- folded into ``name`` over ``defaults``; a field of the outer class
    keeps its own name. ``name`` itself takes an ``inner``, None (``inner(**defaults)``), or, where ``aliases``
    maps ``name`` to a field, that field's value (``engine="fast"``: ``EngineConfig(kind="fast")``). Reading a
    flat name (``cfg.max_batch``, ``cfg.max_model_len``) reads the embedded object's field. Decorators stack,
    one embedded field each.
    """
    aliases = dict(aliases or {})

    def embed(cls):
        init, own = cls.__init__, {f.name for f in dataclasses.fields(cls)}
        fields = {f.name for f in dataclasses.fields(inner)}
        flat_names = {a for a in aliases if a != name and a not in own} | (fields - own)
        outer_getattr = getattr(cls, "__getattr__", None)

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            given = kwargs.pop(name, None)
            flat = {aliases.get(k, k): kwargs.pop(k) for k in list(kwargs) if k in flat_names}
            value = _folded(f"{cls.__name__}.{name}", inner, given, aliases.get(name), defaults, flat)
            init(self, *args, **{name: value}, **kwargs)

        def __getattr__(self, attr):
            value = self.__dict__.get(name)
            if isinstance(value, inner) and attr in flat_names:
                return getattr(value, aliases.get(attr, attr))
            if outer_getattr is not None:
                return outer_getattr(self, attr)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

        cls.__init__, cls.__getattr__ = __init__, __getattr__
        return cls

    return embed


def _folded(where: str, inner: type, given: Any, stands_for: str | None, defaults: dict, flat: dict) -> Any:
    """The embedded object: ``given`` (an ``inner``) with the ``flat`` fields replaced, else a new ``inner`` of
    ``flat`` over ``defaults`` (``given`` being its field ``stands_for``, where the embedding field stands for one)."""
    if isinstance(given, inner):
        return dataclasses.replace(given, **flat) if flat else given
    if given is None or stands_for is not None:
        return inner(**{**defaults, **({} if given is None else {stands_for: given}), **flat})
    raise TypeError(f"{where} must be a {inner.__name__} (or left out, its fields given flat), got {given!r}")
