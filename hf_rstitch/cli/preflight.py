"""What a command checks before it imports torch or loads a model, so that bad input is one line at once.

First the data (every row of every ``--data`` source parsed, with its line number in a message), then every
model and router it names (:func:`hf_rstitch.sources.check_sources`: a folder that exists, or a Hub id in the
cache or known to the Hub after one short request). Loading still checks again; this only moves the failures
to the start.
"""

from __future__ import annotations

from typing import Iterable


def check_data(data: str | Iterable[str] | None, columns: str = "", limit: int | None = None) -> None:
    """Read every source of ``data`` as the command will (:func:`hf_rstitch.eval.data.load_problems`)."""
    from ..eval.data import load_problems

    for source in [data] if isinstance(data, str) else list(data or []):
        if source:  # no --data: the command's own default split
            load_problems(source, limit=limit, columns=columns)


def preflight(data: str | Iterable[str] | None = None, columns: str = "", limit: int | None = None,
              sources: dict[str, str | None] | None = None) -> None:
    """:func:`check_data`, then the ``{flag: source}`` models and routers."""
    from ..sources import check_sources

    check_data(data, columns, limit)
    check_sources(sources or {})
