"""What a run sends the page: :class:`Frame` s, each a pane's snapshot with the text of every token.

:func:`frames` runs a stitched run (and, if asked, the LLM alone after it) on a loaded pair and yields frames; the
page renders them (:func:`hf_rstitch.ui.render.answer_html`) without a tokenizer. So the same frames can come from
this process (``app()`` in a notebook) or from the model worker (``rstitch ui``, :mod:`.worker`), pickled over a
pipe. Nothing here knows about Gradio.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from .code import reproduce
from .pair import PairError
from .render import WINDOW, token_texts
from .run import RunError, RunSettings, Snapshot, stream

log = logging.getLogger("hf_rstitch.ui")

STITCHED, LLM_ALONE = "stitched", "llm"  # the panes


@dataclass
class Frame:
    """One update of one pane: ``snap`` with ``texts[i]`` the text token ``snap.ids[i]`` adds (see
    :func:`~hf_rstitch.ui.render.token_texts`), and the code box's script for the run."""

    pane: str
    snap: Snapshot
    texts: list[str]
    code: str


class Texts:
    """:func:`~hf_rstitch.ui.render.token_texts` of a growing answer, decoding only the tokens that are new (a
    token's text depends on the :data:`~hf_rstitch.ui.render.WINDOW` tokens before it)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.texts: list[str] = []

    def __call__(self, ids: list[int]) -> list[str]:
        same = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            same += 1
        start = max(0, same - WINDOW)
        fresh = token_texts(self.tokenizer, ids[start:])[same - start:]  # the window before `same` is context only
        self.ids, self.texts = list(ids), self.texts[:same] + fresh
        return list(self.texts)


def frames(pair, settings: RunSettings, compare: bool) -> Iterator[Frame]:
    """The frames of a run on ``pair``: the stitched pane as it streams, then (``compare``) the LLM alone's. The
    settings are checked here (:meth:`~hf_rstitch.ui.run.RunSettings.checked` imports torch, which the page's process
    of ``rstitch ui`` never does).

    Raises:
        RunError: the settings cannot run, or the run failed (the message says why); frames may have been yielded
            before.
    """
    settings = settings.checked()
    code = reproduce(pair, settings)
    texts = Texts(pair.tokenizer)
    for snap in stream(pair, settings):
        yield Frame(STITCHED, snap, texts(snap.ids), code)
    if compare:
        texts = Texts(pair.tokenizer)
        for snap in stream(pair, settings, stitched=False):
            yield Frame(LLM_ALONE, snap, texts(snap.ids), code)


def failure(err: Exception) -> str:
    """The page's message for what a load or a run raised: a refusal's own message, else one line naming an
    unexpected error (whose traceback goes to the server's log)."""
    if isinstance(err, (RunError, PairError)):
        return str(err)
    from ..sources import one_line

    log.error("rstitch ui: unexpected error", exc_info=err)
    return f"unexpected error ({type(err).__name__}): {one_line(err)}"
