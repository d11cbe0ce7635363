"""hf-rstitch's messages follow transformers' verbosity.

The library logs through ``logging.getLogger("hf_rstitch.<module>")``. Once transformers loads,
:func:`bridge` makes the ``hf_rstitch`` logger take its level from transformers' library logger
while nobody set one for it, so ``transformers.logging.set_verbosity_info()`` (or
``TRANSFORMERS_VERBOSITY=error``) reaches hf-rstitch's messages too. They go to stderr, as
transformers' do, when the application configured no logging of its own (with a root handler,
``logging.basicConfig`` or pytest's ``caplog``, records propagate there as usual).

An application that configures the ``hf_rstitch`` logger itself (a level or a handler, as the
``rstitch`` command does) is left alone.
"""

from __future__ import annotations

import logging
import sys

NAME = "hf_rstitch"


def _transformers_logger() -> logging.Logger:
    from transformers.utils import logging as hf_logging

    return hf_logging.get_logger()  # the "transformers" library logger, configured by transformers


class _FollowsTransformers(logging.Logger):
    """A logger whose unset level reads transformers' verbosity (children read it through ``parent.level``)."""

    @property
    def level(self) -> int:  # type: ignore[override]
        own = self.__dict__.get("level", logging.NOTSET)
        return own or _transformers_logger().getEffectiveLevel()

    @level.setter
    def level(self, value: int) -> None:
        self.__dict__["level"] = value


class _ToStderr(logging.StreamHandler):
    """stderr, as transformers prints its own messages, unless the root logger has handlers (they print it)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stderr  # the stream of the moment (a test's capture, a redirect), not the one at import
            super().emit(record)


def bridge() -> None:
    """Tie the ``hf_rstitch`` logger to transformers' verbosity (idempotent; skipped if the application set it up)."""
    log = logging.getLogger(NAME)
    if isinstance(log, _FollowsTransformers) or log.handlers or log.__dict__.get("level", logging.NOTSET):
        return
    log.__class__ = _FollowsTransformers
    log.addHandler(_ToStderr())
    log.manager._clear_cache()  # cached isEnabledFor answers were computed with the old level
