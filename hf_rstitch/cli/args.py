"""Build argparse options from a config dataclass, so help text lives in one place.

Each field becomes ``--field-name``; its help is ``field(metadata={"help": ...})``. Lists
take several values (``--thresholds 0.01 0.02``); bools become ``--flag/--no-flag``.
Validation stays in the dataclass (``__post_init__``), so the Python API and the CLI
reject the same bad input with the same message.

Why not ``transformers.HfArgumentParser``, which does the same from the same dataclasses: it does
not fit these configs. (1) It gives ``--no-x`` only to bools whose default is True; ``--no-colour``
(default: colour on a terminal, so ``None``) and the other ``--x/--no-x`` pairs here would become
``--x false``. (2) It adds every field and hands ``field.metadata`` to ``add_argument`` as keyword
arguments, so a field kept off the command line (``metadata={"cli": False}``: objects such as
``EvalConfig.router``) fails to register. (3) Errors must end the command as ``rstitch CMD: error:``
with exit status 2 (:func:`dataclass_from_args`), and ``--field-name`` is the only spelling (it
also registers ``--field_name``). ``tests/cli/test_first_hour.py`` checks (1) and (2) against the
installed transformers, so this layer can go once they stop holding.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(element type, is_list) for int/float/str/Optional[...]/list[...] annotations."""
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (list, tuple, typing.Sequence):
        return (args[0] if args else str), True
    if args and origin is not None:  # Optional[X] / X | None
        return _base_type(args[0])
    return tp, False


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after an option's help, except where there is no value to show (``None``, ``""``) or
    the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, "") or "default" in (action.help or ""):
            return action.help
        if isinstance(action.default, str) and not action.default.strip():  # "\n\n" would print as nothing
            return f"{action.help} (default: {action.default!r})"
        return super()._get_help_string(action)


def _embedded(cls: type) -> list[tuple[type, Any]]:
    """(dataclass, the names of its fields to take) for each field of ``cls`` that embeds a config whole
    (``metadata={"embed": True}`` for every field of it, or a list of names)."""
    hints = typing.get_type_hints(cls)
    return [(hints[f.name], f.metadata["embed"]) for f in dataclasses.fields(cls) if f.metadata.get("embed")]


def _dest(f: dataclasses.Field) -> str:
    """The option's name: ``metadata["flag"]`` (``"max-model-len"``) or the field's, as a Python name."""
    return f.metadata.get("flag", f.name).replace("-", "_")


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, only: Any = True) -> None:
    """Add one option per field of dataclass ``cls`` (``only``: the names of the fields to add, True: all); a
    field embedding a config whole adds that config's options (``metadata={"embed": True or [names]}``); defaults
    are shown as :class:`DefaultsHelpFormatter` does. Options come in the order of the fields."""
    parser.formatter_class = DefaultsHelpFormatter
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli") is False or (only is not True and f.name not in only):
            continue
        if f.metadata.get("embed"):  # the embedded config's options, where its field stands
            add_dataclass_args(parser, hints[f.name], f.metadata["embed"])
            continue
        flag = "--" + _dest(f).replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        )
        tp, is_list = _base_type(hints[f.name])
        if tp is bool:
            parser.add_argument(flag, dest=_dest(f), action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
            continue
        kwargs: dict[str, Any] = {"dest": _dest(f), "default": default, "type": tp,
                                  "help": help_text}
        if is_list:
            kwargs["nargs"] = "+"
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(flag, **kwargs)


def dataclass_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Instantiate ``cls`` from the parsed options (validation runs in ``__post_init__``).

    A validation error ends the command like an argparse error: message on stderr, exit code 2.
    """
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    names |= {_dest(f) for inner, _ in _embedded(cls) for f in dataclasses.fields(inner)}  # taken flat
    try:
        return cls(**{k: v for k, v in vars(args).items() if k in names})
    except (ValueError, TypeError) as err:
        command = getattr(args, "command", None) or ""
        print(f"rstitch {command}: error: {err}".replace("  ", " "), file=sys.stderr)
        raise SystemExit(2) from None
