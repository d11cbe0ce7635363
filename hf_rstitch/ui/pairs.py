"""The pairs of a page loaded in this process: :class:`Pairs` loads each pair once, in a background thread, and warms
it up; the page asks it for a pair's :class:`~hf_rstitch.ui.pair.PairInfo` and for a run's frames. ``app()`` uses
one in the page's own process; ``rstitch ui``'s model worker (:mod:`.worker`) one in its process. Nothing here knows
about Gradio (the warm-up converts the summary through the page's table component when given one).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterator

from .frames import Frame, frames, page_outputs
from .pair import Loads, Pair, PairError, PairInfo, describe, load
from .run import MAX_NEW_TOKENS, RunSettings

log = logging.getLogger("hf_rstitch.ui")


class Pairs:
    """Pairs by ``(llm, slm)`` reference, each loaded and warmed up once, one at a time, in a background thread
    (:meth:`start`); :meth:`get` waits for one. A load that failed is forgotten, so asking again retries it."""

    def __init__(self, table=None, routers: dict | None = None):
        self.table = table  # the summary component: the warm-up converts a table as the page will
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rstitch-ui-load")
        self.loads = Loads(lambda key, router: self.worker.submit(self._load, key, router), routers)

    def start(self, llm: str | None, slm: str | None, router: str | None = None) -> concurrent.futures.Future:
        """The pair's load (begun now unless begun before; raises as :meth:`~hf_rstitch.ui.pair.Loads.start`)."""
        return self.loads.start(llm, slm, router)

    def get(self, llm: str | None, slm: str | None) -> Pair:
        """The pair, once loaded and warmed up (waits for it).

        Raises:
            PairError: the pair cannot load (the message says why).
        """
        return self.loads.result(llm, slm)

    def ready(self, llm: str | None, slm: str | None) -> PairInfo:
        """What the page shows for the pair, once loaded and warmed up (waits for it; raises as :meth:`get`)."""
        return describe(self.get(llm, slm), MAX_NEW_TOKENS)

    def frames(self, key: tuple[str, str], settings: RunSettings, compare: bool) -> Iterator[Frame]:
        """A run's frames (:func:`hf_rstitch.ui.frames.frames`; raises as it does, and as :meth:`get`)."""
        return frames(self.get(*key), settings, compare)

    def _load(self, key: tuple[str, str], router: str | None) -> Pair:
        try:
            pair = load(*key, router)
        except PairError as err:
            log.error("rstitch ui: %s", err)
            raise
        _warm_up(pair, self.table)
        return pair


def _warm_up(pair: Pair, table) -> None:
    """A 4-token run through the page's own path and the table's conversion (``table``: None in the worker), so the
    first run the user starts imports nothing and sets nothing up (on a busy 2-core machine the first run's first
    token came 5 s later than the second's without it)."""
    try:
        settings = RunSettings("1 + 1 =", pair.threshold, 4).checked()
        for outputs in page_outputs(frames(pair, settings, compare=False), settings.threshold):
            if table is not None:
                table.postprocess(outputs[6])
    except Exception:  # noqa: BLE001  (a warm-up that fails costs the first run its imports, nothing else)
        log.exception("rstitch ui: warm-up failed")
