"""One run of the app: a stitched ``generate`` (and, if asked, the LLM alone) streamed as snapshots.

``generate`` runs in a worker thread with a streamer; the caller iterates :func:`stream` and gets a
:class:`Snapshot` whenever tokens arrive (and on a clock tick while none do). Which model wrote each token is
known as it streams: the routing policy is wrapped in :class:`Watch`, which records, per new token, the entropy
each model had where it ran (the LLM ran at position ``i`` exactly when it was asked to hand back after it).
The last snapshot is rebuilt from ``out.stitch``, the trace every consumer reads; a test checks the watched
roles equal it. Nothing here knows about Gradio.
"""

from __future__ import annotations

import contextlib
import copy
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..core.roles import Role

MAX_NEW_TOKENS = 2048  # the page's upper bound: a run must end while the user watches
TICK_S = 0.1  # a snapshot at least this often while a run is going (the clock), at most this often while tokens come
SAMPLING = dict(do_sample=True, temperature=0.6, top_p=0.95)  # as `rstitch generate --sample`
_SEEDED = threading.Lock()  # torch's global RNG: a sampled run seeds it and samples without another run in between


class RunError(ValueError):
    """Input the page refuses, or a run that failed: the message is shown in the page."""


@dataclass
class RunSettings:
    """What the controls say. :meth:`checked` refuses what cannot run, with a message for the page."""

    prompt: str
    threshold: float
    max_new_tokens: int = 200
    sample: bool = False
    router: bool = False
    seed: int = 0

    def checked(self) -> "RunSettings":
        from ..core.policies import check_threshold

        if not (self.prompt or "").strip():
            raise RunError("The prompt is empty: type a question (e.g. a word problem) and press Run.")
        try:
            self.threshold = check_threshold(self.threshold, "threshold")
        except (TypeError, ValueError) as err:
            raise RunError(str(err).replace("`threshold`", "The threshold")) from None
        tokens = self.max_new_tokens
        if not isinstance(tokens, (int, float)) or not math.isfinite(tokens) or not 1 <= tokens <= MAX_NEW_TOKENS:
            raise RunError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, got {tokens!r}.")
        self.max_new_tokens = int(tokens)
        self.seed = int(self.seed or 0)
        return self


@dataclass
class Snapshot:
    """What one pane shows at one moment: the new tokens so far, who wrote each, the entropies, the clock.

    ``slm_entropy[i]`` / ``llm_entropy[i]``: that model's normalized entropy at new token ``i`` where it ran, else None.
    ``summary``: ``out.stitch.summary()`` once a stitched run ended (None while it runs, and for the LLM alone).
    """

    ids: list[int] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)
    slm_entropy: list[float | None] = field(default_factory=list)
    llm_entropy: list[float | None] = field(default_factory=list)
    seconds: float = 0.0
    done: bool = False
    summary: dict[str, Any] | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return len(self.ids) / self.seconds if self.done and self.seconds > 0 else None


class Watch:
    """A routing policy, watched: it decides as ``inner`` does and records each model's entropy per new token."""

    def __init__(self, inner):
        self.inner = inner
        self.needs_hidden = inner.needs_hidden
        self.threshold = getattr(inner, "threshold", None)
        self.slm: dict[int, float] = {}  # new-token index -> the SLM's entropy there (it ran)
        self.llm: dict[int, float] = {}  # new-token index -> the LLM's entropy there (it ran and wrote the token)

    def reset(self) -> None:
        self.inner.reset()
        self.slm.clear()
        self.llm.clear()

    def hand_to_llm(self, step):
        self.slm[step.index] = float(step.entropy[0])
        return self.inner.hand_to_llm(step)

    def hand_to_slm(self, step):
        self.llm[step.index] = float(step.entropy[0])
        return self.inner.hand_to_slm(step)

    def role(self, index: int) -> Role:
        return Role.LLM if index in self.llm else Role.SLM

    def __repr__(self) -> str:
        return repr(self.inner)


class _QueueStreamer:
    """A transformers streamer that hands each step's token ids to a queue (the prompt, put first, is skipped)."""

    END = None

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.queue.put(value.flatten().tolist())

    def end(self) -> None:
        """generate's own end(): ignored; the worker ends the queue once generate has returned its output."""

    def close(self) -> None:
        self.queue.put(self.END)


def prompt_ids(pair, prompt: str):
    """``[1, T]`` prompt ids on the pair's device: the chat template where the tokenizer has one, else the raw text."""
    import torch

    from ..eval.data import prompt_ids as ids_of

    chat = bool(getattr(pair.tokenizer, "chat_template", None))
    return torch.tensor([ids_of(pair.tokenizer, prompt, instruction="", chat_template=chat)], device=pair.device)


def policy(pair, settings: RunSettings):
    """The routing policy of a stitched run: the pair's router at the threshold, or the entropy rule."""
    from ..core.policies import EntropyPolicy

    if settings.router and pair.router:
        from ..router.policy import policy_from_router

        return policy_from_router(pair.router, pair.slm, settings.threshold)
    if settings.router:
        raise RunError("This pair has no R-Stitch+ router; turn the router off (or start the app with one).")
    return EntropyPolicy(settings.threshold)


def _generate_kwargs(pair, settings: RunSettings, stitched: Watch | None) -> dict:
    kwargs = dict(max_new_tokens=settings.max_new_tokens, return_dict_in_generate=True,
                  **(SAMPLING if settings.sample else dict(do_sample=False)))
    if stitched is not None:
        return dict(kwargs, assistant_model=pair.slm, stitch_policy=stitched)
    plain = copy.deepcopy(pair.llm.generation_config)
    plain.stitch_threshold = None  # a tuned LLM stitches by default; the comparison is the LLM alone
    plain.update(**kwargs)
    return dict(generation_config=plain)


def stream(pair, settings: RunSettings, stitched: bool = True) -> Iterator[Snapshot]:
    """Run ``generate`` (stitched, or the LLM alone) and yield snapshots; the last has ``done=True``.

    Raises:
        RunError: the run failed (the message says why); a snapshot may have been yielded before.
    """
    watch = Watch(policy(pair, settings)) if stitched else None
    ids = prompt_ids(pair, settings.prompt)
    streamer = _QueueStreamer()
    outcome: dict[str, Any] = {}

    def work():
        import torch

        try:
            with _SEEDED if settings.sample else contextlib.nullcontext():
                if settings.sample:
                    torch.manual_seed(settings.seed)
                outcome["out"] = pair.llm.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer,
                                                   **_generate_kwargs(pair, settings, watch))
        except Exception as err:  # noqa: BLE001  (shown in the page; the app keeps serving)
            outcome["error"] = err
        finally:
            streamer.close()

    start = time.perf_counter()
    worker = threading.Thread(target=work, daemon=True, name="rstitch-ui-run")
    worker.start()
    new: list[int] = []
    for batch in _batches(streamer.queue):
        new.extend(batch)
        yield _live(new, watch, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    worker.join()
    if "error" in outcome:
        from ..sources import one_line

        raise RunError(f"generate failed: {one_line(outcome['error'])}") from outcome["error"]
    yield final(outcome["out"], ids.shape[1], seconds, stitched)


def _batches(q: queue.Queue) -> Iterator[list[int]]:
    """The tokens that arrived, gathered for at most :data:`TICK_S` (an empty list on a tick without tokens)."""
    while True:
        got: list[int] = []
        deadline = time.perf_counter() + TICK_S
        while True:
            try:
                item = q.get(timeout=max(deadline - time.perf_counter(), 0.0))
            except queue.Empty:
                break
            if item is _QueueStreamer.END:
                if got:
                    yield got
                return
            got.extend(item)
        yield got


def _live(new: list[int], watch: Watch | None, seconds: float) -> Snapshot:
    if watch is None:
        return Snapshot(ids=list(new), roles=[Role.LLM] * len(new), slm_entropy=[None] * len(new),
                        llm_entropy=[None] * len(new), seconds=seconds)
    n = len(new)
    return Snapshot(ids=list(new), roles=[watch.role(i) for i in range(n)],
                    slm_entropy=[watch.slm.get(i) for i in range(n)], llm_entropy=[watch.llm.get(i) for i in range(n)],
                    seconds=seconds)


def final(out, prompt_len: int, seconds: float, stitched: bool) -> Snapshot:
    """The last snapshot, from ``generate``'s output: the trace's roles and entropies (stitched), or the LLM's
    tokens."""
    new = out.sequences[0, prompt_len:].tolist()
    if not stitched:
        return Snapshot(ids=new, roles=[Role.LLM] * len(new), slm_entropy=[None] * len(new),
                        llm_entropy=[None] * len(new), seconds=seconds, done=True)
    trace = out.stitch
    new = new[: trace.n_tokens]  # rows are not padded at batch 1; the trace counts the generated tokens
    llm_h = [h if role is Role.LLM else None for role, h in zip(trace.roles, trace.entropies)]
    return Snapshot(ids=new, roles=list(trace.roles), slm_entropy=list(trace.slm_entropies), llm_entropy=llm_h,
                    seconds=seconds, done=True, summary=trace.summary())
