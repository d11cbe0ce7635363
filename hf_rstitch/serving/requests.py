"""Continuous batching: requests join and leave one running stitched batch.

:class:`RequestEngine` keeps a batch of up to ``max_batch`` rows over one pair of lanes (the
fast engine's where it runs the pair, else the eager ones: ``engine=``). Each
:meth:`~RequestEngine.step` admits waiting requests into free rows, then decodes one token for
every running row with :func:`~hf_rstitch.decode.step.run_step` (the same switch point as
``generate``); a row that finishes (EOS, its ``max_new_tokens``, or cancelled) leaves at once,
and its place is taken at the next step. Each request routes with its own threshold, and a
greedy request's tokens equal its solo ``generate`` (tested).

Layout: rows share the columns of one left-padded sequence; joining, leaving and trimming them is
:mod:`.columns`'s. With ``prefill_chunk`` (fast lanes) joining prompts are read a bounded chunk a step while the
batch decodes and join once read (:mod:`.admission`).

Scheduling (``schedule=``, :mod:`hf_rstitch.core.scheduling`): with :class:`GatherForLLM`, rows
whose next token is the LLM's may wait a step or two (no token, no event) so that one LLM call
serves several of them, while the SLM's rows go on. A waiting row moves one column to the right
(``hold_rows`` of each lane); its tokens, route and trace are those of its solo run all the same.

Run-ahead (lanes that allow it: the fast engine's graphs), as in ``generate``
(:mod:`hf_rstitch.decode.loop`): once a step's tokens are appended on the device, the next step's
first lane call is queued before the host reads the tokens, so the GPU decodes while the host
makes this step's events. Not on steps with held rows or a schedule, nor when a waiting request
could take a free row at the next step: a request arriving meanwhile, or freed rows, wait one step
more for admission. Rows that finish or are cancelled are cut from the early call's output.

KV memory (the fast engine's lanes, always paged here: :mod:`hf_rstitch.fast.paged_kv`): a row holds the blocks
of the tokens it has written; requests join while their prompts' blocks are free, and when the running rows
outgrow the pool the newest are requeued with their tokens and resume (:mod:`.kv_budget`, :mod:`.preemption`).

Faults stay with their request: ``submit`` checks a request and builds all it needs (its generator,
eos set, threshold: :func:`~.request_types.prepare`) before it may touch the rows, so a bad request is
a ``ValueError`` there; a row whose own sampling fails inside a step ends alone with an ``error``
event; a step that fails for the whole batch (a model call raised) ends the running requests with
``error`` events, returns the engine to a consistent empty batch (waiting requests stay) and raises
:class:`~.request_types.StepFailed`. Each request carries one :class:`~.request_types.RequestStatus`;
:meth:`RequestEngine.check_consistent` asserts the bookkeeping.

The engine knows no tokenizer and no HTTP: token ids in, events out. ``submit`` and ``cancel``
are thread-safe; one thread calls ``step`` (a server's engine loop, or :meth:`run`).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Iterable, Iterator

import torch

from ..core.policies import PinnedRoles, RowEntropyPolicy, check_threshold, checked
from ..core.policies_rows import RowPolicies
from ..core.roles import Role
from ..core.sampling import sample_one
from ..core.scheduling import LLMSchedule
from ..core.trace import StitchTrace
from ..decode.lane import checked_schedule
from ..decode.loop import keep_ahead, run_ahead
from ..decode.step import Routing, run_step, to_device
from ..decode.step_values import receive_values, send_values
from ..engine.engine import Engine, build
from ..engine.config import HELD_COLUMNS, EngineConfig
from ..engine.pair import Pair
from ..hf.settings import DEFAULT_THRESHOLD
from .admission import Staging
from .columns import Columns
from .endings import Endings
from .kv_budget import budget_of
from .preemption import Preemption
from .request_types import (FINISH_REASONS, Completion, Event, QueueFull, Request, RequestState,  # noqa: F401
                            RequestStatus, StepFailed, generator_for, prepare)

HOLD_TRIM = HELD_COLUMNS  # held rows grow the shared padding; it is trimmed once every row has this much (one copy per row)


def _build(llm, slm, spec, max_batch, max_length, schedule, prefill_chunk, kv_tokens, paged) -> Engine:
    """The engine of ``RequestEngine(llm, slm, engine=spec, ...)``: every row's whole budget of KV memory unless
    ``kv_tokens`` says otherwise (nothing sized from the GPU's memory: that is ``rstitch serve``'s
    ``--kv-memory``)."""
    cfg = EngineConfig.of(spec, max_batch=max_batch, max_length=max_length, kv_memory=None, kv_tokens=kv_tokens,
                          paged=paged, prefill_chunk=prefill_chunk or 0)
    return build(Pair.of(llm, slm), cfg.for_requests(schedule))


class RequestEngine(Columns, Preemption, Endings):
    """Serve many requests through one stitched batch (any device; the fast engine on CUDA by default).

    Args:
        llm: the pair's built engine (:func:`hf_rstitch.engine.build` of an :meth:`~hf_rstitch.engine.EngineConfig.for_requests`: ``rstitch
            serve`` and ``rstitch eval`` build it once and hand it down; ``slm`` and the engine's settings below are
            then its own), or the LLM of the pair, with ``slm`` (shared tokenizer), as for ``generate``: the engine
            is built here from ``engine``, ``max_batch``, ``max_length``, ``kv_tokens``, ``paged`` and
            ``prefill_chunk``.
        threshold: the default tau for requests that bring none.
        max_batch: rows decoded together at most; further requests wait in a queue.
        max_waiting: requests that may wait beyond the batch's rows: :meth:`submit` refuses (``QueueFull``)
            once ``max_batch + max_waiting`` requests are running or waiting; None: unbounded. The one
            admission limit (a server answers 429 on it).
        policy: one routing policy for every request (e.g. ``RandomPolicy``, a router's
            ``RouterPolicy``); then requests may not bring their own ``stitch_threshold``. Default:
            the entropy rule with each request's threshold.
        engine: ``None`` (the default): ``"auto"``, or the engine ``$HF_RSTITCH_ENGINE`` names.
            ``"auto"``: the fast engine where it runs the pair, else the eager lanes, the reason logged
            (:func:`hf_rstitch.engine.choose`); ``"default"``: the eager lanes (any device and model);
            the fast engine on CUDA: ``"fast"``, a :class:`hf_rstitch.fast.FastConfig` or a
            :class:`hf_rstitch.fast.FastEngine`.
        max_length: with the fast engine, the longest prompt + ``max_new_tokens`` a request may
            ask for (the width of the caches' block tables); longer requests are refused at :meth:`submit`.
        kv_tokens: with the fast engine, the KV memory of each lane in tokens (paged caches, blocks of
            :data:`hf_rstitch.fast.blocks.BLOCK_TOKENS`: :mod:`hf_rstitch.fast.paged_kv`); requests join while
            their prompts' blocks are free and rows that outgrow it are requeued (:mod:`.preemption`). None:
            ``max_batch x max_length`` (every row's whole budget: nothing is ever preempted).
        paged: with the fast engine, paged caches (the default); False: static slabs of ``max_length`` a row, as
            before paged caches (kept to measure against; ``kv_tokens`` is then ignored).
        schedule: when the LLM runs for the rows that need it: ``None`` / ``"now"`` (at once, the
            default), a :class:`~hf_rstitch.core.scheduling.GatherForLLM` or its string form
            (``"gather:2:8"``: wait at most 2 steps, run at once from 8 rows). Full-attention models.
        prefill_chunk: tokens of joining prompts each lane reads a step while rows decode (rows x columns,
            padding included; :mod:`hf_rstitch.serving.admission`): a long prompt joins over several steps instead
            of stalling the batch for its whole prefill. None (the default): the step's joins prefill whole,
            together. Lanes without stages (the eager engine's) always join whole.
    """

    def __init__(self, llm, slm=None, threshold: float = DEFAULT_THRESHOLD, max_batch: int = 8, max_waiting: int | None = None,
                 policy=None, engine=None, max_length: int = 4096, schedule: LLMSchedule | str | None = None,
                 prefill_chunk: int | None = None, kv_tokens: int | None = None, paged: bool = True):
        built = llm if isinstance(llm, Engine) else _build(llm, slm, engine, max_batch, max_length, schedule,
                                                           prefill_chunk, kv_tokens, paged)
        self.engine, pair, cfg = built, built.pair, built.config
        self.llm, self.slm, self.vocab, self.device = pair.llm, pair.slm, pair.vocab, pair.device
        self.default_eos, self.pad_id = pair.eos, pair.pad_id
        self.threshold = check_threshold(threshold)
        self.max_batch, self.max_waiting = cfg.max_batch, max_waiting
        self.schedule = checked_schedule(schedule, self.llm, self.slm)
        if self.schedule is not None and cfg.spare_columns < HOLD_TRIM:
            raise ValueError(f"a schedule holds rows back, which needs {HOLD_TRIM} spare columns in the caches; build "
                             "the engine from EngineConfig.for_requests(schedule) (hf_rstitch.engine.config).")
        self.lanes, self.max_length = built.lanes(), built.max_length
        self.kv = budget_of(self.lanes.values())  # paged lanes: admission and preemption by free blocks
        self._staging = Staging.for_lanes(self.lanes, cfg.prefill_chunk or None)  # None: joins prefill whole
        self.thresholds = RowEntropyPolicy() if policy is None else None
        self.per_row = RowPolicies(self.thresholds) if policy is None else None  # requests' own policies
        self.policy = PinnedRoles(self.per_row if policy is None else checked(policy))
        self.policy.reset()
        if max_waiting is not None and (not isinstance(max_waiting, int) or max_waiting < 0):
            raise ValueError(f"max_waiting must be None or an integer >= 0, got {max_waiting!r}")
        self._rows: list[RequestState] = []  # RUNNING, in batch order
        self._slots = torch.zeros(0, dtype=torch.long)  # [b] row id of each running row (StepView.rows)
        self._seq = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [b, T] shared columns
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._routing = Routing.start(0)
        self._waiting: deque[RequestState] = deque()  # WAITING, in order of arrival
        self._cancel: set[str] = set()
        self._states: dict[str, RequestState] = {}  # every request not finished yet, by id
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._step_index = 0
        self._ahead = None  # the next step's first lane call, run early (run_ahead); admission waits for it
        self.stats = {"steps": 0, "slm_calls": 0, "llm_calls": 0, "held": 0, "ahead": 0,
                      "preempted": 0}  # held: row-steps waiting; preempted: rows requeued for KV memory

    # ---- public API ---------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Requests without a row: queued, or joining (their prompts read in chunks: ``prefill_chunk``)."""
        return len(self._waiting) + (len(self._staging) if self._staging is not None else 0)

    @property
    def running(self) -> int:
        return len(self._rows)

    def has_work(self) -> bool:
        return bool(self._rows or self._waiting or self._staging)

    @property
    def capacity(self) -> int | None:
        """Requests the engine holds at most (running + waiting); None: unbounded."""
        return None if self.max_waiting is None else self.max_batch + self.max_waiting

    def status(self, request_id: str) -> RequestStatus | None:
        """The request's status while the engine holds it; None once it has finished (or if unknown)."""
        with self._lock:
            state = self._states.get(request_id)
            return state.status if state is not None else None

    def submit(self, request: Request) -> str:
        """Queue a request; returns its id. Bad input raises ValueError / TypeError now, a full engine
        ``QueueFull``; ``request`` is not changed (but for its ``request_id`` when None)."""
        r = prepare(request, vocab=self.vocab, max_length=self.max_length, default_eos=self.default_eos,
                    routes_per_request=self.thresholds is not None)
        self._check_fits(r)
        try:
            generator = generator_for(r)
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"Request.seed {r.seed!r} does not seed a torch.Generator ({err}); "
                             "use an integer in [-2**63, 2**64).") from None
        tau = None
        if self.thresholds is not None:
            tau = r.stitch_threshold if r.stitch_threshold is not None else self.threshold
        name = repr(self.policy.base) if tau is None else f"EntropyPolicy(threshold={tau})"
        if r.stitch_policy is not None:
            tau, name = getattr(r.stitch_policy, "threshold", None), repr(r.stitch_policy)
        eos = frozenset(r.eos_token_id) if r.eos_token_id is not None else self.default_eos
        state = RequestState(r, eos, StitchTrace(policy=name, threshold=tau), generator=generator)
        with self._lock:
            held = len(self._states) - len(self._cancel & self._states.keys())  # a cancelled request's place is free
            if self.capacity is not None and held >= self.capacity:
                raise QueueFull(f"{held} requests in flight (limit {self.capacity} = max_batch {self.max_batch} running "
                                f"+ max_waiting {self.max_waiting} waiting); retry later or raise max_waiting / max_batch.")
            if r.request_id is None:
                r.request_id = request.request_id = f"req-{next(self._ids)}"
            if r.request_id in self._states:
                raise ValueError(f"request_id {r.request_id!r} is already in use; give each request its own id.")
            self._states[r.request_id] = state
            self._waiting.append(state)
        return r.request_id

    def cancel(self, request_id: str) -> None:
        """Stop a waiting or running request; its row is freed at the next step (a "cancelled" event)."""
        with self._lock:
            self._cancel.add(request_id)

    @torch.no_grad()
    def step(self) -> list[Event]:
        """Admit waiting requests into free rows, then decode one token for every running row. Raises
        :class:`StepFailed` (after ending the running requests) if the step fails for the whole batch."""
        events = self._take_cancelled()
        try:
            events += self._step()
        except Exception as err:  # noqa: BLE001 -- a model call raised: every running row is lost with it
            events += self._fail_batch(f"{type(err).__name__}: {err}")
            raise StepFailed(err, events) from err
        return events

    def _step(self) -> list[Event]:
        events = []
        if self._ahead is None:  # the lanes have read the next column for the running rows only
            self._admit()
        events += self._make_room()  # paged lanes: rows that would outgrow the KV pool wait again
        if not self._rows:
            return events
        ahead, self._ahead = self._ahead, None
        out = run_step(self.lanes, self._seq, self._mask, self._routing, self.policy, self._step_index, self._slots,
                       schedule=self.schedule, ahead=ahead)
        self._step_index += 1
        held = set(out.held.nonzero().flatten().tolist()) if out.held is not None else set()  # rows without a token
        self._count(out, held)
        picked, failed = self._pick(out.logits, held, out.greedy)  # [b] on the device; rows whose sampling failed
        self._append(picked, held)
        pending = send_values(picked, out.entropy, out.slm_entropy, out.back, self.vocab >= 1 << 24)  # before an early call: see its wait
        if not held and not failed and self.schedule is None and not self._admissible():
            self._ahead = run_ahead(self.lanes, out, self._seq, self._mask, self.policy.needs_hidden)
            self.stats["ahead"] += self._ahead is not None
        tokens, entropy, slm_h, back = receive_values(pending)
        self._routing.after(out.writer_llm, back, out.held, out.no_llm)
        for i, call in out.calls:
            self._rows[i].trace.calls.append(call)
        b = len(self._rows)  # per-row values as Python lists: one conversion each, not b tensor reads
        writer, handed = out.writer_llm.tolist(), out.handed.tolist() if out.handed is not None else [False] * b
        slm = slm_h.tolist() if slm_h is not None else [None] * b
        done = []
        for i, (row, token, h) in enumerate(zip(self._rows, tokens.tolist(), entropy.tolist())):
            if i in failed:  # this row alone: it leaves with an error, the others go on
                events.append(self._finish(row, "error", error=failed[i]))
                done.append(i)
                continue
            if i in held:  # no token: remember the hand-over for the token the LLM writes later
                row.held = row.held or (handed[i], slm[i])
                continue
            events.append(self._advance_row(row, token, writer[i], handed[i], h, slm[i]))
            if events[-1].finished:
                done.append(i)
        self._drop(done)
        return events

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

    # ---- admission ------------------------------------------------------------------------------
    def _take_waiting(self, n: int) -> list[RequestState]:
        """Up to ``n`` waiting requests, in order of arrival, and no more than the free rows."""
        with self._lock:
            free = self.max_batch - len(self._rows) - (len(self._staging) if self._staging is not None else 0)
            free = self._admit_limit(list(itertools.islice(self._waiting, max(0, min(n, free)))))  # and their blocks
            return [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]

    def _admit(self) -> None:
        staged = None
        if self._staging is not None and self._rows:  # rows decode: joining prompts are read a chunk a step
            staged, new = self._staging.step(self._take_waiting)
        else:
            new = self._staging.release()[1] if self._staging is not None else []  # an empty batch: join at once
            new += self._take_waiting(self.max_batch - len(new))
        if not new:
            return
        if not self._rows:  # an empty batch starts afresh: no columns, fresh caches
            for lane in self.lanes.values():
                lane.reset()
            self._seq, self._mask = self._seq[:, :0], self._mask[:, :0]
        slots = []
        for state in new:  # the host's record first: a lane that fails below fails these rows with the batch
            slots.append(self._free_slot(slots))
            state.status = RequestStatus.RUNNING
        self._rows += new
        self._join(new, slots, staged)

    def _admissible(self) -> bool:
        """Whether a waiting request would take a free row at the next step."""
        with self._lock:
            if self._staging:
                return True
            room = bool(self._waiting) and len(self._rows) < self.max_batch
            return room and self._admit_limit([self._waiting[0]]) > 0  # and its prompt's KV blocks

    def _free_slot(self, taken: list[int]) -> int:
        used = set(self._slots.tolist()) | set(taken)
        return next(i for i in itertools.count() if i not in used)

    # ---- one step's tokens ----------------------------------------------------------------------
    def _count(self, out, held: set[int]) -> None:
        st = self.stats
        st["steps"] += 1
        st["slm_calls"] += out.slm_entropy is not None
        st["llm_calls"] += out.back is not None
        st["held"] += len(held)

    def _pick(self, logits: torch.Tensor, held: set[int], greedy: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, dict[int, str]]:
        """Greedy argmax per row (``greedy``: the lanes found it reading the logits out); rows that sample draw from
        their own generator (held rows draw nothing). Also the rows whose sampling raised, with the reason: they
        fail alone (their token is a placeholder)."""
        sampled = any(row.request.do_sample for row in self._rows)
        tokens = logits.argmax(dim=-1) if greedy is None else greedy.clone() if sampled else greedy
        failed = {}
        for i, row in enumerate(self._rows):
            r = row.request
            if r.do_sample and i not in held:
                try:
                    tokens[i] = sample_one(logits[i], r.temperature, r.top_p, row.generator)
                except Exception as err:  # noqa: BLE001 -- e.g. NaN logits in this row: this request alone fails
                    failed[i] = f"sampling failed for this request ({type(err).__name__}: {err})"
        return tokens, failed

    def _append(self, tokens: torch.Tensor, held: set[int]) -> None:
        """One new column: each row's token, or, for held rows, a masked column in front (they move right)."""
        self._seq = torch.cat([self._seq, tokens.to(self._seq.device)[:, None]], dim=-1)
        self._mask = torch.cat([self._mask, self._mask.new_ones(len(self._rows), 1)], dim=-1)
        if not held:
            return
        index = sorted(held)
        at = to_device(index, self.device)
        self._seq[at] = torch.nn.functional.pad(self._seq[at, :-1], (1, 0), value=self.pad_id)
        self._mask[at] = torch.nn.functional.pad(self._mask[at, :-1], (1, 0), value=0)
        for lane in self.lanes.values():
            lane.hold_rows(index)
        for i in index:
            self._rows[i].pad += 1
        self._trim(HOLD_TRIM)

    def _advance_row(self, row: RequestState, token: int, llm: bool, handed: bool, entropy: float,
                     slm_h: float | None) -> Event:
        if row.held is not None:  # the LLM's token after waiting: the hand-over happened when it began to wait
            (handed, slm_h), row.held = row.held, None
        t = row.trace
        t.roles.append(Role.LLM if llm else Role.SLM)
        t.handovers.append(handed)
        t.entropies.append(entropy)
        t.slm_entropies.append(slm_h if (not llm or handed) else None)
        reason = "stop" if token in row.eos else ("length" if t.n_tokens >= row.request.max_new_tokens else None)
        if reason is not None:
            return self._finish(row, reason, token=token)
        return Event(row.request_id, token, t.roles[-1])
