"""What a run sends the page: :class:`Frame` s, each a pane's snapshot with the text of every token.

:func:`frames` runs a stitched run (and, if asked, the LLM alone after it) on a loaded pair and yields frames;
:func:`page_outputs` turns them into what the page's components show (:mod:`.render`), without a tokenizer. So the
same frames can come from this process (``app()`` in a notebook) or from the model worker (``rstitch ui``,
:mod:`.worker`), pickled over a pipe. Nothing here knows about Gradio.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from collections.abc import Iterator

from .code import reproduce
from .pair import PairError
from .render import WINDOW, answer_html, clock_line, entropy_svg, summary_rows, token_texts
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


def page_outputs(run: Iterator[Frame], threshold: float):
    """The page's outputs (see :func:`hf_rstitch.ui.page.build`) for each frame of a run: the stitched pane (its
    clock, plot, summary) as it streams, then the LLM alone's beside the finished stitched one, with the speed-up
    once both ended."""
    plot = left = stitched = None
    for frame in run:
        snap = frame.snap
        if frame.pane == LLM_ALONE:
            speedup = snap.seconds / stitched.seconds if snap.done and stitched.seconds > 0 else None
            yield ("", left, clock_line(stitched.seconds, len(stitched.ids), True, speedup),
                   answer_html(frame.texts, snap.roles, "llm"),
                   clock_line(snap.seconds, len(snap.ids), snap.done), plot,
                   summary_rows(stitched.summary), frame.code)
            continue
        stitched, left = snap, answer_html(frame.texts, snap.roles, "stitched")
        plot = entropy_svg(snap.slm_entropy, snap.llm_entropy, threshold)
        yield ("", left, clock_line(snap.seconds, len(snap.ids), snap.done), "", "", plot,
               summary_rows(snap.summary), frame.code)
