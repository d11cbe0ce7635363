"""Continuous batching: requests join and leave one running stitched batch.

:class:`RequestEngine` keeps a batch of up to ``max_batch`` rows over the lanes of a pair's built engine (the fast
engine's where it runs the pair, else the eager ones). Each :meth:`~RequestEngine.step` is schedule -> execute ->
update, as in vLLM's v1 engine core (docs/serving.md, "The request engine"):

* the :class:`~.scheduler.Scheduler` alone decides which requests run: admission into free rows (at once, or in
  groups: :class:`~hf_rstitch.core.scheduling.JoinPacing`, the config's ``join_wait``), preemption by KV blocks, the
  joins' chunks (:mod:`.chunked_prefill`); it returns a :class:`~.scheduler.StepPlan` and keeps each request's
  :class:`~.request_types.RequestStatus`;
* the :class:`~.executor.Executor` runs the plan on the lanes (:mod:`.batch`: the rows' shared columns): one token
  for every running row with :func:`~hf_rstitch.decode.step.run_step` (the same switch point as ``generate``),
  its values' copy to the host queued, and where the algorithm allows the next step's first lane call queued
  before the host reads them (run-ahead), so that the host's update runs while the device works;
* the update (:func:`~.update.update_from_output`) turns the step's values into events; a row that finishes (EOS,
  its ``max_new_tokens``) leaves at once, and its place is taken by a request that joins at the end of the next
  step's calls (joins ahead: its first token comes in the step after; with join pacing, up to ``join_wait`` steps
  later, by a group).

Each request routes with its own threshold, and a greedy request's tokens equal its solo ``generate`` (tested).
With :class:`~hf_rstitch.core.scheduling.GatherForLLM` (``schedule=``), rows whose next token is the LLM's may
wait a step or two (no token, no event) so that one LLM call serves several of them, while the SLM's rows go on;
their tokens, route and trace are those of their solo run all the same.

Faults stay with their request: ``submit`` checks a request and builds all it needs (its generator, eos set,
threshold: :func:`~.request_types.prepare`) before it may touch the rows, so a bad request is a ``ValueError``
there; a row whose own sampling fails inside a step ends alone with an ``error`` event; a step that fails for the
whole batch (a model call raised) ends the running requests with ``error`` events, returns the engine to a
consistent empty batch (waiting requests stay) and raises :class:`~.request_types.StepFailed`.
:meth:`RequestEngine.check_consistent` asserts the bookkeeping.

The engine knows no tokenizer and no HTTP: token ids in, events out. ``submit`` and ``cancel`` are thread-safe;
one thread calls ``step`` (a server's engine loop, or :meth:`run`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterable, Iterator

import torch

from ..core.policies import PinnedRoles, RowEntropyPolicy, check_threshold, checked
from ..core.policies_rows import RowPolicies, ServerRouter
from ..core.sampling import sample_one
from ..core.scheduling import LLMSchedule
from ..core.trace import StitchTrace
from ..decode.lane import checked_schedule
from ..decode.step import run_step
from ..engine.config import HELD_COLUMNS, EngineConfig
from ..engine.engine import Engine, build
from ..engine.pair import Pair
from ..hf.settings import DEFAULT_THRESHOLD
from .batch import Batch
from .chunked_prefill import ChunkedPrefill
from .executor import Executor
from .kv_budget import budget_of
from .request_types import (FINISH_REASONS, Completion, Event, QueueFull, Request, RequestState,  # noqa: F401
                            RequestStatus, StepFailed, generator_for, prepare)
from .scheduler import Scheduler
from .update import update_from_output

HOLD_TRIM = HELD_COLUMNS  # held rows grow the shared padding; it is trimmed once every row has this much (one copy per row)


class RequestEngine:
    """Serve many requests through one stitched batch, over a pair's built engine (any device; the fast engine on
    CUDA by default).

    ``RequestEngine(engine, ...)`` runs an engine built once (:func:`hf_rstitch.engine.build` of an
    :meth:`~hf_rstitch.engine.EngineConfig.for_requests`: ``rstitch serve`` and ``rstitch eval`` build it and hand
    it down; its config holds the rows, lengths and KV memory); :meth:`of` builds that engine from the two models
    and keyword arguments, as for ``generate``.

    Args:
        engine: the pair's built :class:`~hf_rstitch.engine.Engine`.
        threshold: the default tau for requests that bring none.
        max_waiting: requests that may wait beyond the batch's rows: :meth:`submit` refuses (``QueueFull``)
            once ``max_batch + max_waiting`` requests are running or waiting; None: unbounded. The one
            admission limit (a server answers 429 on it).
        policy: one routing policy for every request (e.g. ``RandomPolicy``, a router's
            ``RouterPolicy``); then requests may not bring their own ``stitch_threshold``. Default:
            the entropy rule with each request's threshold.
        schedule: when the LLM runs for the rows that need it: ``None`` / ``"now"`` (at once, the
            default), a :class:`~hf_rstitch.core.scheduling.GatherForLLM` or its string form
            (``"gather:2:8"``: wait at most 2 steps, run at once from 8 rows). Full-attention models; one that
            holds rows back needs an engine built with its spare columns (``EngineConfig.for_requests(schedule)``).
    """

    def __init__(self, engine: Engine, threshold: float = DEFAULT_THRESHOLD, max_waiting: int | None = None,
                 policy=None, schedule: LLMSchedule | str | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"RequestEngine runs a pair's built engine (hf_rstitch.engine.build), got "
                            f"{type(engine).__name__}; for two models use RequestEngine.of(llm, slm, ...), which "
                            "builds it.")
        self.engine, pair, cfg = engine, engine.pair, engine.config
        self.llm, self.slm, self.vocab, self.device = pair.llm, pair.slm, pair.vocab, pair.device
        self.default_eos, self.pad_id = pair.eos, pair.pad_id
        self.threshold = check_threshold(threshold)
        self.max_batch, self.max_waiting = cfg.max_batch, max_waiting
        if max_waiting is not None and (not isinstance(max_waiting, int) or max_waiting < 0):
            raise ValueError(f"max_waiting must be None or an integer >= 0, got {max_waiting!r}")
        self.schedule = checked_schedule(schedule, self.llm, self.slm)
        if self.schedule is not None and cfg.spare_columns < HELD_COLUMNS:
            raise ValueError(f"a schedule holds rows back, which needs {HELD_COLUMNS} spare columns in the caches; "
                             "build the engine from EngineConfig.for_requests(schedule) (hf_rstitch.engine.config).")
        self.lanes, self.max_length = engine.lanes(), engine.max_length
        self.kv = budget_of(self.lanes.values())  # paged lanes: admission and preemption by free blocks
        self.thresholds = RowEntropyPolicy() if policy is None else None
        self.server_policy = None if policy is None else checked(policy)  # every request's, but for their own
        per_row = RowPolicies(self.thresholds if policy is None else self.server_policy)  # requests' own policies
        self.policy = PinnedRoles(per_row)
        self.policy.reset()
        self.stats = {"steps": 0, "slm_calls": 0, "llm_calls": 0, "held": 0, "ahead": 0, "undone": 0,
                      "joined_ahead": 0, "ahead_after_read": 0, "preempted": 0, "joins": 0, "joined": 0,
                      "paced": 0}  # held: row-steps waiting for the LLM; ahead, undone, joined_ahead, ahead_after_read:
        # the Executor's (calls run a step early; those of them undone; rows that joined before a step's values were
        # read; next calls queued once the values were read); the rest: the Scheduler's
        chunks = ChunkedPrefill.for_lanes(self.lanes, cfg.prefill_chunk or None)  # None: joins prefill whole
        self.scheduler = Scheduler(self.max_batch, self.kv, chunks, self.stats, cfg.join_pacing())
        batch = Batch(self.lanes, self.device, self.pad_id, self.policy, self.thresholds, per_row)
        self.executor = Executor(batch, self.vocab, self.schedule, self.stats, step=run_step, sample=sample_one,
                                 hold_trim=HOLD_TRIM, join_ahead=self.scheduler.join_ahead)
        self._ids = itertools.count()

    @classmethod
    def of(cls, llm, slm, threshold: float = DEFAULT_THRESHOLD, max_batch: int = 8, max_waiting: int | None = None,
           policy=None, engine=None, max_length: int = 4096, schedule: LLMSchedule | str | None = None,
           prefill_chunk: int | None = None, kv_tokens: int | None = None, paged: bool = True,
           join_wait: int | None = None, join_group: int | None = None) -> RequestEngine:
        """The request engine of ``llm`` and ``slm`` (one tokenizer), its engine built here once
        (:func:`hf_rstitch.engine.build`) with every row's whole budget of KV memory unless ``kv_tokens`` says
        otherwise (nothing sized from the GPU's memory: that is ``rstitch serve``'s ``--kv-memory``).
        ``threshold``, ``max_waiting``, ``policy`` and ``schedule`` are as for the class.

        Args:
            max_batch: rows decoded together at most; further requests wait in a queue.
            engine: ``None`` (the default): ``"auto"``, or the engine ``$HF_RSTITCH_ENGINE`` names.
                ``"auto"``: the fast engine where it runs the pair, else the eager lanes, the reason logged
                (:func:`hf_rstitch.engine.choose`); ``"default"``: the eager lanes (any device and model);
                the fast engine on CUDA: ``"fast"``, a :class:`hf_rstitch.fast.FastConfig` or a
                :class:`hf_rstitch.fast.FastEngine`.
            max_length: with the fast engine, the longest prompt + ``max_new_tokens`` a request may
                ask for (the width of the caches' block tables); longer requests are refused at :meth:`submit`.
            prefill_chunk: tokens of joining prompts each lane reads a step while rows decode (rows x columns,
                padding included; :mod:`hf_rstitch.batching.chunked_prefill`): a long prompt joins over several
                steps instead of stalling the batch for its whole prefill. None (the default): the step's joins
                prefill whole, together. Lanes without stages (the eager engine's) always join whole.
            kv_tokens: with the fast engine, the KV memory of each lane in tokens (paged caches, blocks of
                :data:`hf_rstitch.fast.blocks.BLOCK_TOKENS`: :mod:`hf_rstitch.fast.paged_kv`); requests join while
                their prompts' blocks are free and rows that outgrow it are requeued (:mod:`.scheduler`). None:
                ``max_batch x max_length`` (every row's whole budget: nothing is ever preempted).
            paged: with the fast engine, paged caches (the default); False: static slabs of ``max_length`` a row
                (kept to measure against; ``kv_tokens`` is then ignored).
            join_wait, join_group: join pacing (:class:`~hf_rstitch.core.scheduling.JoinPacing`): free rows may
                stay empty up to ``join_wait`` steps so that waiting requests join in groups (of ``join_group`` at
                once); 0: they join at once. None: :class:`~hf_rstitch.engine.EngineConfig`'s defaults (``rstitch
                serve``'s).
        """
        pacing = {k: v for k, v in (("join_wait", join_wait), ("join_group", join_group)) if v is not None}
        cfg = EngineConfig.of(engine, max_batch=max_batch, max_length=max_length, kv_memory=None, kv_tokens=kv_tokens,
                              paged=paged, prefill_chunk=prefill_chunk or 0, **pacing)
        built = build(Pair.of(llm, slm), cfg.for_requests(schedule))
        return cls(built, threshold=threshold, max_waiting=max_waiting, policy=policy, schedule=schedule)

    # ---- public API ---------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Requests without a row: queued, or joining (their prompts read in chunks: ``prefill_chunk``)."""
        chunks = self.scheduler.chunks
        return len(self.scheduler.waiting) + (len(chunks) if chunks is not None else 0)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.running or s.waiting or s.chunks)

    @property
    def capacity(self) -> int | None:
        """Requests the engine holds at most (running + waiting); None: unbounded."""
        return None if self.max_waiting is None else self.max_batch + self.max_waiting

    def status(self, request_id: str) -> RequestStatus | None:
        """The request's status while the engine holds it; None once it has finished (or if unknown)."""
        with self.scheduler.lock:
            state = self.scheduler.states.get(request_id)
            return state.status if state is not None else None

    def submit(self, request: Request) -> str:
        """Queue a request; returns its id. Bad input raises ValueError / TypeError now, a full engine
        ``QueueFull``; ``request`` is not changed (but for its ``request_id`` when None)."""
        r = prepare(request, vocab=self.vocab, max_length=self.max_length, default_eos=self.default_eos,
                    routes_per_request=self.thresholds is not None)
        if isinstance(r.stitch_policy, ServerRouter):
            r = dataclasses.replace(r, stitch_policy=self._server_router(r.stitch_policy))
        self.scheduler.check_fits(r)
        try:
            generator = generator_for(r)
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"Request.seed {r.seed!r} does not seed a torch.Generator ({err}); "
                             "use an integer in [-2**63, 2**64).") from None
        tau = None
        if self.thresholds is not None:
            tau = r.stitch_threshold if r.stitch_threshold is not None else self.threshold
        name = repr(self.server_policy) if tau is None else f"EntropyPolicy(threshold={tau})"
        if r.stitch_policy is not None:
            tau, name = getattr(r.stitch_policy, "threshold", None), repr(r.stitch_policy)
        eos = frozenset(r.eos_token_id) if r.eos_token_id is not None else self.default_eos
        state = RequestState(r, eos, StitchTrace(policy=name, threshold=tau), generator=generator)
        sched = self.scheduler
        with sched.lock:
            held = len(sched.states) - len(sched.cancelled & sched.states.keys())  # a cancelled request's place is free
            if self.capacity is not None and held >= self.capacity:
                raise QueueFull(f"{held} requests in flight (limit {self.capacity} = max_batch {self.max_batch} running "
                                f"+ max_waiting {self.max_waiting} waiting); retry later or raise max_waiting / max_batch.")
            if r.request_id is None:
                r.request_id = request.request_id = f"req-{next(self._ids)}"
            if r.request_id in sched.states:
                raise ValueError(f"request_id {r.request_id!r} is already in use; give each request its own id.")
            sched.add(state)
        return r.request_id

    def cancel(self, request_id: str) -> None:
        """Stop a waiting or running request; its row is freed at the next step (a "cancelled" event)."""
        with self.scheduler.lock:
            self.scheduler.cancelled.add(request_id)

    @torch.no_grad()
    def step(self) -> list[Event]:
        """Schedule -> execute -> update: one token for every running row (module docstring). Raises
        :class:`StepFailed` (after ending the running requests) if the step fails for the whole batch."""
        events, gone = self.scheduler.take_cancelled()
        self._leave(gone)
        try:
            plan = self.scheduler.schedule(admit=not self.executor.ran_ahead)  # host: joins, preemption, a chunk
            events += plan.events
            run = self.executor.execute(plan, self.scheduler.admissible)  # device: queued, then the next call early
            if run is not None:
                if not self.executor.ran_ahead:
                    self.scheduler.read_ahead()  # device: a joining group's next chunk, beside the host's reading
                done = update_from_output(plan.rows, run.wait(), self.scheduler.finish)  # host, while the device runs
                events += done[0]
                self._leave(done[1])
        except Exception as err:  # noqa: BLE001 -- a model call raised: every running row is lost with it
            events += self._fail_batch(f"{type(err).__name__}: {err}")
            raise StepFailed(err, events) from err
        return events

    def _server_router(self, spec: ServerRouter):
        """The engine's own router policy at a request's threshold (``stitch_policy`` ``router`` / ``r2r``)."""
        base = self.server_policy
        if getattr(base, "kind", None) != spec.kind or not hasattr(base, "with_threshold"):
            has = "no router" if base is None else f"{base!r}"
            raise ValueError(f"stitch_policy {spec.kind!r} routes by the server's own {spec.kind} router, but this "
                             f"engine routes with {has}; start the server with --router <an "
                             f"{'R-Stitch+' if spec.kind == 'router' else 'R2R'} router> or name another policy.")
        return base.with_threshold(spec.threshold)

    def _leave(self, index: list[int]) -> None:
        """The running rows ``index`` leave the batch (they finished or were cancelled)."""
        self.executor.leave(self.scheduler.running, index)
        self.scheduler.leave(index)

    def _fail_batch(self, message: str) -> list[Event]:
        """Every running request ends with an error; the batch starts afresh (waiting requests stay)."""
        self.executor.forget(self.scheduler.running)
        return self.scheduler.fail_running(message)

    def check_consistent(self) -> None:
        """Assert the bookkeeping between steps: one row per running request in every per-row structure,
        each request's status matching where it is, no slot or id used twice. Raises AssertionError."""
        self.scheduler.check()
        self.executor.check(self.scheduler.running)

    def run(self, requests: Iterable[Request] = ()) -> dict[str, Completion]:
        """Submit ``requests`` and step until nothing is left; every completion by request id."""
        for request in requests:
            self.submit(request)
        tokens: dict[str, list[int]] = {}
        done: dict[str, Completion] = {}
        for e in self.events():
            if e.token is not None:
                tokens.setdefault(e.request_id, []).append(e.token)
            if e.finished:
                done[e.request_id] = Completion(e.request_id, tokens.pop(e.request_id, []), e.finish_reason, e.trace)
        return done

    def events(self) -> Iterator[Event]:
        """Step until no request is left, yielding every event."""
        while self.has_work():
            yield from self.step()

    # ---- what tests and benchmarks read ---------------------------------------------------------
    @property
    def _rows(self) -> list[RequestState]:
        return self.scheduler.running

    @property
    def _mask(self) -> torch.Tensor:
        return self.executor.batch.mask

    @property
    def _staging(self) -> ChunkedPrefill | None:
        return self.scheduler.chunks
