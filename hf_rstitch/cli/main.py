"""``rstitch`` entry point. Each subcommand lives in its own module under ``hf_rstitch.cli``
and exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules
import their heavy dependencies inside ``run`` so ``rstitch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..sources import one_line
from ..threads import TINY_PARAMS

# Subcommand modules, in the order --help lists them.
# Commands whose default models (no --llm / --slm / --model) are the shipped pair.
USES_SHIPPED_PAIR = ("demo", "generate", "eval", "serve", "train-router", "toyworld", "ui")
SUBCOMMANDS = ["demo", "generate", "eval", "tune", "serve", "profile", "train_router", "toyworld", "export_hub_template",
               "env", "ui"]


def _load_subcommands() -> list:
    mods = []
    for name in SUBCOMMANDS:
        try:
            mods.append(importlib.import_module(f"hf_rstitch.cli.{name}"))
        except ModuleNotFoundError as err:
            if err.name != f"hf_rstitch.cli.{name}":
                raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstitch",
        description=(
            "R-Stitch: a small model (SLM) and a large model (LLM) take turns token by token; the SLM "
            "decodes while it is confident (normalized entropy <= tau), the LLM takes the uncertain steps."
        ),
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"rstitch (hf-rstitch) {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=_positive_int, default=None, metavar="N", help=(
        "torch CPU threads. Default: 1 when every model is tiny (under "
        f"{TINY_PARAMS // 1_000_000}M parameters, e.g. the shipped pair: more threads only add overhead there, "
        "badly so on a busy machine), else torch's own choice; OMP_NUM_THREADS, if set, is respected"))
    for mod in _load_subcommands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter, parents=[common])
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of threads, got {text!r}")
    return value


def _model_sources(args: argparse.Namespace) -> list[str]:
    """The model folders / Hub ids the command will load (the shipped pair where that is its default)."""
    from ..resources import resolve, shipped

    named = [resolve(s) for s in (getattr(args, k, None) for k in ("llm", "slm", "model")) if s]
    if named or args.command not in USES_SHIPPED_PAIR:
        return named
    return [str(shipped("llm")), str(shipped("slm"))]


def _choose_threads(args: argparse.Namespace) -> None:
    """Pick torch's CPU threads for the models about to load (hf_rstitch.threads) and say so on stderr."""
    from ..threads import apply_threads

    try:
        sources = _model_sources(args)
    except (ValueError, FileNotFoundError):
        return  # a bad shipped:NAME: the command reports it
    line = apply_threads(sources, getattr(args, "threads", None))
    if line:
        print(f"rstitch {args.command}: {line}", file=sys.stderr)


def _show_library_logs() -> None:
    """The library logs through ``logging`` (``hf_rstitch.*``); the command shows its INFO and above on stderr."""
    import logging

    log = logging.getLogger("hf_rstitch")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def main(argv: list[str] | None = None) -> int:
    _show_library_logs()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        _choose_threads(args)
        return int(args._run(args) or 0)
    except SystemExit as stop:  # config validation (cli/args.py) already printed its message
        return stop.code if isinstance(stop.code, int) else 1
    except (ValueError, OSError, ImportError) as err:  # bad input, unreadable file, missing model or extra: one line
        print(f"rstitch {args.command}: error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
