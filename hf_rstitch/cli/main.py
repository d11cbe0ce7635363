"""``rstitch`` entry point. Each subcommand lives in its own module under ``hf_rstitch.cli``
and exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules
import their heavy dependencies inside ``run`` so ``rstitch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order --help lists them.
SUBCOMMANDS = ["demo", "generate", "eval", "tune", "serve", "profile", "train_router", "toyworld", "export_hub_template"]


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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _load_subcommands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


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
        return int(args._run(args) or 0)
    except SystemExit as stop:  # config validation (cli/args.py) already printed its message
        return stop.code if isinstance(stop.code, int) else 1
    except (ValueError, FileNotFoundError) as err:  # bad input found past the config: say what, not a traceback
        print(f"rstitch {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
