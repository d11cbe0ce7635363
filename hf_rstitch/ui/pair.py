"""The model pair the app shows: loaded once, with what the page needs to know about it.

:func:`load` turns two references (Hub ids, folders, ``shipped:llm`` / ``shipped:slm``; none: the shipped pair)
into a :class:`Pair` through the package's one loader (:func:`hf_rstitch.hf.loading.load_pair`, device and dtype
``"auto"`` as ``generate`` would choose them). :func:`refs` checks the references without importing torch (the page
starts before the models load). A reference that cannot load raises :class:`PairError`, whose message the page
shows; :func:`describe` says what the page needs to know about a loaded pair in a :class:`PairInfo` (plain data: it
crosses from the model worker to the page). Nothing here knows about Gradio.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_THRESHOLD = 0.02  # when neither the LLM's generation config nor a router names one
BUDGET = 256  # the page's max new tokens where the LLM's generation config names none


class PairError(ValueError):
    """A pair that cannot be shown: the message says what was wrong and how to fix it."""


@dataclass
class Pair:
    """A loaded SLM/LLM pair and what the controls default to.

    Attributes:
        llm, slm, tokenizer: the models (eval mode) and the LLM's tokenizer.
        llm_ref, slm_ref: the references as the user gave them (``shipped:llm`` for the shipped pair), for the code box.
        router: the R-Stitch+ router reference (``"shipped"``, a folder or Hub id), or None where the pair has none.
        threshold: the slider's default tau.
    """

    llm: Any
    slm: Any
    tokenizer: Any
    llm_ref: str
    slm_ref: str
    router: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    shipped: bool = field(default=False)

    @property
    def device(self):
        return next(self.llm.parameters()).device


def _is_shipped(ref: str, name: str) -> bool:
    from ..resources import resolve, shipped

    try:
        return Path(resolve(ref)).resolve() == shipped(name).resolve()
    except (OSError, ValueError):
        return False


def _router_for(llm, shipped_pair: bool, router: str | None) -> str | None:
    """The router the pair has: the one given, else the LLM's generation config's, else the shipped one for the
    shipped pair."""
    from ..hf.settings import ROUTER_KEY

    if router:
        return router
    configured = getattr(llm.generation_config, ROUTER_KEY, None)
    if configured:
        return configured
    return "shipped" if shipped_pair else None


def _default_threshold(llm, router: str | None) -> float:
    """``generation_config.stitch_threshold`` (what ``rstitch tune`` writes), else the router's own tau, else
    :data:`DEFAULT_THRESHOLD`."""
    from ..hf.settings import THRESHOLD_KEY

    tau = getattr(llm.generation_config, THRESHOLD_KEY, None)
    if tau is not None:
        return float(tau)
    if router == "shipped":
        import json

        from ..resources import shipped

        return float(json.loads((shipped("router") / "config.json").read_text())["threshold"])
    return DEFAULT_THRESHOLD


def refs(llm: str | None = None, slm: str | None = None) -> tuple[str, str]:
    """The pair's ``(llm, slm)`` references (none given: the shipped pair's), checked without loading anything: both
    or neither given, and a local folder that exists and holds a model.

    Raises:
        PairError: the references cannot name a pair (the message says why and how to fix it).
    """
    from ..resources import resolve
    from ..sources import check_local_source, one_line

    if bool(llm) != bool(slm):
        raise PairError("give both an LLM and an SLM (--llm and --slm), or neither to use the shipped pair")
    llm_ref, slm_ref = (llm, slm) if llm else ("shipped:llm", "shipped:slm")
    try:
        for flag, ref in (("LLM", llm_ref), ("SLM", slm_ref)):
            check_local_source(resolve(ref), flag)
    except (OSError, ValueError) as err:
        raise PairError(f"cannot load the pair (LLM {llm_ref}, SLM {slm_ref}): {one_line(err)}") from err
    return llm_ref, slm_ref


def is_shipped(llm_ref: str, slm_ref: str) -> bool:
    """Whether the references name the shipped pair (the page's default prompt is then one of its problems)."""
    return _is_shipped(llm_ref, "llm") and _is_shipped(slm_ref, "slm")


def load(llm: str | None = None, slm: str | None = None, router: str | None = None) -> Pair:
    """Load the pair (default: the shipped one) on the device and dtype ``generate`` would pick.

    Raises:
        PairError: one of the models cannot load (a missing folder, a Hub id offline or unknown), or the two
            tokenizers differ; the message names the model and the fix.
    """
    from ..hf.loading import load_pair, resolve_device
    from ..resources import resolve
    from ..sources import one_line

    llm_ref, slm_ref = refs(llm, slm)
    try:
        models = load_pair(resolve(llm_ref), resolve(slm_ref), "auto", resolve_device("auto"))
    except (OSError, ValueError, ImportError) as err:
        raise PairError(f"cannot load the pair (LLM {llm_ref}, SLM {slm_ref}): {one_line(err)}") from err
    router = _router_for(models[0], is_shipped(llm_ref, slm_ref), router)
    return Pair(*models, llm_ref=llm_ref, slm_ref=slm_ref, router=router,
                threshold=_default_threshold(models[0], router), shipped=is_shipped(llm_ref, slm_ref))


@dataclass(frozen=True)
class PairInfo:
    """What the page shows and defaults to for a loaded pair (:func:`describe`): plain data, no model.

    Attributes:
        llm_ref, slm_ref, router, threshold, shipped: as :class:`Pair`'s.
        budget: the max-new-tokens slider's default (the LLM's generation config's, else :data:`BUDGET`).
        line: one line of HTML naming the models, their sizes, the device, tau and the router.
    """

    llm_ref: str
    slm_ref: str
    router: str | None
    threshold: float
    shipped: bool
    budget: int
    line: str

    @property
    def router_info(self) -> str:
        return f"router: {self.router}" if self.router else "this pair has no router"


def describe(pair: Pair, max_new_tokens: int) -> PairInfo:
    """The :class:`PairInfo` of a loaded pair; the budget is at most ``max_new_tokens`` (the page's bound)."""
    budget = min(int(getattr(pair.llm.generation_config, "max_new_tokens", None) or BUDGET), max_new_tokens)
    info = PairInfo(pair.llm_ref, pair.slm_ref, pair.router, pair.threshold, pair.shipped, budget, "")
    params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.llm, pair.slm)]
    line = (f"LLM <code>{pair.llm_ref}</code> ({params[0]:.1f}M), SLM <code>{pair.slm_ref}</code> ({params[1]:.1f}M) "
            f"on {pair.device}; default tau {pair.threshold:g}; {info.router_info}")
    return replace(info, line=line)


class Loads:
    """A page's pair loads by ``(llm, slm)`` reference, each begun once (``begin(key, router)``, called under
    ``lock``, returns its future); a load that failed is forgotten, so asking again retries it. ``routers``: the
    router given for a pair (the first pair's)."""

    def __init__(self, begin: Callable[[tuple[str, str], str | None], concurrent.futures.Future],
                 routers: dict | None = None, lock: threading.Lock | None = None):
        self.begin, self.routers, self.lock = begin, dict(routers or {}), lock or threading.Lock()
        self.futures: dict[tuple[str, str], concurrent.futures.Future] = {}

    def start(self, llm: str | None, slm: str | None, router: str | None = None) -> concurrent.futures.Future:
        """The pair's load (begun now unless begun before).

        Raises:
            PairError: the references cannot name a pair (:func:`refs`).
        """
        key = refs((llm or "").strip() or None, (slm or "").strip() or None)
        with self.lock:
            if key not in self.futures:
                self.futures[key] = self.begin(key, router or self.routers.get(key))
            return self.futures[key]

    def result(self, llm: str | None, slm: str | None):
        """The load's result, once done (waits for it); a :class:`PairError` forgets the load and is raised."""
        future = self.start(llm, slm)
        try:
            return future.result()
        except PairError:
            with self.lock:
                for key in [k for k, f in self.futures.items() if f is future]:
                    del self.futures[key]
            raise
