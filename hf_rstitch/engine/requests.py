"""Continuous batching: requests join and leave one running stitched batch.

:class:`RequestEngine` keeps a batch of up to ``max_batch`` rows over one pair of lanes (the
fast engine's where it runs the pair, else the eager ones: ``engine=``). Each
:meth:`~RequestEngine.step` admits waiting requests into free rows, then decodes one token for
every running row with :func:`~hf_rstitch.engine.step.run_step` (the same switch point as
``generate``); a row that finishes (EOS, its ``max_new_tokens``, or cancelled) leaves at once,
and its place is taken at the next step. Each request routes with its own threshold, and a
greedy request's tokens equal its solo ``generate`` (tested).

Layout: rows share the columns of one left-padded sequence (see :mod:`.lane`). A joining
request is right-aligned with the others -- left-padded to the batch's width, or the batch is
padded on the left when the new prompt is longer -- and each lane prefills the columns it has
already seen for it; columns that became padding in every row are trimmed when rows leave.

Scheduling (``schedule=``, :mod:`hf_rstitch.core.scheduling`): with :class:`GatherForLLM`, rows
whose next token is the LLM's may wait a step or two (no token, no event) so that one LLM call
serves several of them, while the SLM's rows go on. A waiting row moves one column to the right
(``hold_rows`` of each lane); its tokens, route and trace are those of its solo run all the same.

Run-ahead (lanes that allow it: the fast engine's graphs), as in ``generate``
(:mod:`hf_rstitch.engine.loop`): once a step's tokens are appended on the device, the next step's
first lane call is queued before the host reads the tokens, so the GPU decodes while the host
makes this step's events. Not on steps with held rows or a schedule, nor when a waiting request
could take a free row at the next step: a request arriving meanwhile, or freed rows, wait one step
more for admission. Rows that finish or are cancelled are cut from the early call's output.

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
from ..core.roles import Role
from ..core.sampling import sample_one
from ..core.scheduling import LLMSchedule
from ..core.trace import StitchTrace
from .lane import checked_schedule
from .protocol import EagerEngine, resolve_engine
from .request_types import FINISH_REASONS, Completion, Event, QueueFull, Request, RunningRow  # noqa: F401
from .loop import keep_ahead, run_ahead
from .step import Routing, run_step, to_device
from .step_values import receive_values, send_values

HOLD_TRIM = 32  # held rows grow the shared padding; it is trimmed once every row has this much (one copy per row)


class RequestEngine:
    """Serve many requests through one stitched batch (any device; the fast engine on CUDA by default).

    Args:
        llm, slm: the pair (shared tokenizer), as for ``generate``.
        threshold: the default tau for requests that bring none.
        max_batch: rows decoded together at most; further requests wait in a queue.
        max_waiting: queue length at which :meth:`submit` refuses (``QueueFull``); None: unbounded.
        policy: one routing policy for every request (e.g. ``RandomPolicy``, a router's
            ``RouterPolicy``); then requests may not bring their own ``stitch_threshold``. Default:
            the entropy rule with each request's threshold.
        engine: ``None`` (the default): ``"auto"``, or the engine ``$HF_RSTITCH_ENGINE`` names.
            ``"auto"``: the fast engine where it runs the pair, else the eager lanes, the reason logged
            (:func:`hf_rstitch.fast.choose_engine`); ``"default"``: the eager lanes (any device and model);
            the fast engine on CUDA: ``"fast"``, a :class:`hf_rstitch.fast.FastConfig` or a
            :class:`hf_rstitch.fast.FastEngine`.
        max_length: with the fast engine, the longest prompt + ``max_new_tokens`` a request may
            ask for (the static caches' capacity); longer requests are refused at :meth:`submit`.
        schedule: when the LLM runs for the rows that need it: ``None`` / ``"now"`` (at once, the
            default), a :class:`~hf_rstitch.core.scheduling.GatherForLLM` or its string form
            (``"gather:2:8"``: wait at most 2 steps, run at once from 8 rows). Full-attention models.
    """

    def __init__(self, llm, slm, threshold: float = 0.02, max_batch: int = 8, max_waiting: int | None = None,
                 policy=None, engine=None, max_length: int = 4096, schedule: LLMSchedule | str | None = None):
        from ..hf.checks import check_pair
        from ..hf.decode import logit_width

        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.llm, self.slm = llm, check_pair(llm, slm)
        self.threshold = check_threshold(threshold)
        self.max_batch, self.max_waiting = max_batch, max_waiting
        self.vocab = min(logit_width(llm), logit_width(slm))
        eos = llm.generation_config.eos_token_id
        self.default_eos = frozenset([eos] if isinstance(eos, int) else (eos or []))
        pad = llm.generation_config.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.default_eos, default=0))
        self.device = llm.device
        self.schedule = checked_schedule(schedule, llm, slm)
        self.max_length = None
        from ..fast import fast_engine

        engine = resolve_engine(llm, slm, engine, max_batch, own=True, fast=fast_engine)
        if isinstance(engine, EagerEngine):
            self.lanes = EagerEngine().lanes(llm, slm, self.vocab, 0)
        else:
            self.max_length = max_length
            slack = HOLD_TRIM if self.schedule is not None else 0  # untrimmed padding of held rows
            self.lanes = engine.lanes(llm, slm, self.vocab, max_batch, max_length + slack)
        self.thresholds = RowEntropyPolicy() if policy is None else None
        self.policy = PinnedRoles(self.thresholds if policy is None else checked(policy))
        self.policy.reset()
        self._rows: list[RunningRow] = []
        self._slots = torch.zeros(0, dtype=torch.long)  # [b] row id of each running row (StepView.rows)
        self._seq = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [b, T] shared columns
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._routing = Routing.start(0)
        self._waiting: deque[Request] = deque()
        self._cancel: set[str] = set()
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._step_index = 0
        self._ahead = None  # the next step's first lane call, run early (run_ahead); admission waits for it
        self.stats = {"steps": 0, "slm_calls": 0, "llm_calls": 0, "held": 0, "ahead": 0}  # held: row-steps waiting

    # ---- public API ---------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._rows)

    def has_work(self) -> bool:
        return bool(self._rows or self._waiting)

    def submit(self, request: Request) -> str:
        """Queue a request; returns its id. Bad input raises ValueError / TypeError now."""
        self._validate(request)
        with self._lock:
            if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting (max_waiting={self.max_waiting}); "
                                "retry later or raise max_waiting / max_batch.")
            if request.request_id is None:
                request.request_id = f"req-{next(self._ids)}"
            if request.request_id in self._known:
                raise ValueError(f"request_id {request.request_id!r} is already in use; give each request its own id.")
            self._known.add(request.request_id)
            self._waiting.append(request)
        return request.request_id

    def cancel(self, request_id: str) -> None:
        """Stop a waiting or running request; its row is freed at the next step (a "cancelled" event)."""
        with self._lock:
            self._cancel.add(request_id)

    @torch.no_grad()
    def step(self) -> list[Event]:
        """Admit waiting requests into free rows, then decode one token for every running row."""
        events = self._take_cancelled()
        if self._ahead is None:  # the lanes have read the next column for the running rows only
            self._admit()
        if not self._rows:
            return events
        ahead, self._ahead = self._ahead, None
        out = run_step(self.lanes, self._seq, self._mask, self._routing, self.policy, self._step_index, self._slots,
                       schedule=self.schedule, ahead=ahead)
        self._step_index += 1
        held = set(out.held.nonzero().flatten().tolist()) if out.held is not None else set()  # rows without a token
        self._count(out, held)
        picked = self._pick(out.logits, held, out.greedy)  # [b] on the device
        self._append(picked, held)
        pending = send_values(picked, out.entropy, out.slm_entropy, out.back)  # before an early call: see its wait
        if not held and self.schedule is None and not self._admissible():
            self._ahead = run_ahead(self.lanes, out, self._seq, self._mask, self.policy.needs_hidden)
            self.stats["ahead"] += self._ahead is not None
        tokens, entropy, slm_h, back = receive_values(pending)
        self._routing.after(out.writer_llm, back, out.held)
        for i, call in out.calls:
            self._rows[i].trace.calls.append(call)
        b = len(self._rows)  # per-row values as Python lists: one conversion each, not b tensor reads
        writer, handed = out.writer_llm.tolist(), out.handed.tolist() if out.handed is not None else [False] * b
        slm = slm_h.tolist() if slm_h is not None else [None] * b
        done = []
        for i, (row, token, h) in enumerate(zip(self._rows, tokens.tolist(), entropy.tolist())):
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
    def _validate(self, r: Request) -> None:
        if not isinstance(r, Request):
            raise TypeError(f"submit() takes a Request, got {type(r).__name__}")
        ids = r.input_ids
        if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("Request.input_ids must be a non-empty list of token ids (ints); tokenize the prompt first.")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"Request.input_ids holds id {bad[0]}, outside the vocabulary both models share "
                             f"(0..{self.vocab - 1}); tokenize with the pair's tokenizer.")
        if not isinstance(r.max_new_tokens, int) or r.max_new_tokens < 1:
            raise ValueError(f"Request.max_new_tokens must be an integer >= 1, got {r.max_new_tokens!r}")
        if self.max_length is not None and len(ids) + r.max_new_tokens > self.max_length:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({r.max_new_tokens}) exceeds the fast "
                             f"engine's max_length {self.max_length}; shorten the request or build the engine with "
                             "a larger max_length.")
        if r.stitch_threshold is not None:
            if self.thresholds is None:
                raise ValueError("this engine routes every request with one policy; drop Request.stitch_threshold "
                                 "or build the engine without `policy=`.")
            r.stitch_threshold = check_threshold(r.stitch_threshold)
        if r.role is not None and not isinstance(r.role, Role):
            r.role = Role(r.role)
        if r.do_sample and not (r.temperature > 0 and 0 < r.top_p <= 1):
            raise ValueError(f"sampling needs temperature > 0 and 0 < top_p <= 1, got {r.temperature}, {r.top_p}")

    def _take_cancelled(self) -> list[Event]:
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            waiting = [r for r in self._waiting if r.request_id in cancel]
            self._waiting = deque(r for r in self._waiting if r.request_id not in cancel)
        events = [Event(r.request_id, None, None, True, "cancelled", trace=StitchTrace()) for r in waiting]
        for r in waiting:
            self._forget(r.request_id)
        gone = [i for i, row in enumerate(self._rows) if row.request.request_id in cancel]
        for i in gone:
            row = self._rows[i]
            events.append(Event(row.request.request_id, None, None, True, "cancelled", trace=row.trace))
            self._forget(row.request.request_id)
        self._drop(gone)
        return events

    def _admit(self) -> None:
        with self._lock:
            free = self.max_batch - len(self._rows)
            new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        if not new:
            return
        if not self._rows:  # an empty batch starts afresh: no columns, fresh caches
            for lane in self.lanes.values():
                lane.reset()
            self._seq, self._mask = self._seq[:, :0], self._mask[:, :0]
        width = max(len(r.input_ids) for r in new)
        grow = width - self._seq.shape[1]
        if grow > 0:
            self._seq = torch.nn.functional.pad(self._seq, (grow, 0), value=self.pad_id)
            self._mask = torch.nn.functional.pad(self._mask, (grow, 0), value=0)
            for lane in self.lanes.values():
                lane.pad_left(grow)
            for row in self._rows:
                row.pad += grow
        width = self._seq.shape[1]
        seq, mask = self._layout(new, width)
        for lane in self.lanes.values():
            lane.add_rows(seq, mask)
        self._seq, self._mask = torch.cat([self._seq, seq]), torch.cat([self._mask, mask])
        self._routing.add([r.role is Role.LLM for r in new])
        slots = []
        for r in new:
            slot = self._free_slot(slots)
            slots.append(slot)
            if r.role is not None:
                self.policy.pins[slot] = r.role
            tau = None
            if self.thresholds is not None:
                tau = r.stitch_threshold if r.stitch_threshold is not None else self.threshold
                self.thresholds.thresholds[slot] = tau
            eos = frozenset(r.eos_token_id) if r.eos_token_id is not None else self.default_eos
            gen = torch.Generator().manual_seed(r.seed) if (r.do_sample and r.seed is not None) else None
            name = repr(self.policy.base) if tau is None else f"EntropyPolicy(threshold={tau})"
            self._rows.append(RunningRow(r, eos, StitchTrace(policy=name, threshold=tau), generator=gen,
                                   pad=width - len(r.input_ids)))
        self._slots = torch.cat([self._slots, torch.tensor(slots, dtype=torch.long)])

    def _layout(self, new: list[Request], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The new prompts right-aligned in ``width`` columns: ids ``[k, width]`` and mask."""
        seq = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, r in enumerate(new):
            seq[i, width - len(r.input_ids):] = torch.tensor(r.input_ids)
            mask[i, width - len(r.input_ids):] = 1
        return to_device(seq, self.device), to_device(mask, self.device)

    def _admissible(self) -> bool:
        """Whether a waiting request would take a free row at the next step."""
        with self._lock:
            return bool(self._waiting) and len(self._rows) < self.max_batch

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

    def _pick(self, logits: torch.Tensor, held: set[int], greedy: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy argmax per row (``greedy``: the lanes found it reading the logits out); rows that sample draw from
        their own generator (held rows draw nothing)."""
        sampled = any(row.request.do_sample for row in self._rows)
        tokens = logits.argmax(dim=-1) if greedy is None else greedy.clone() if sampled else greedy
        for i, row in enumerate(self._rows):
            r = row.request
            if r.do_sample and i not in held:
                tokens[i] = sample_one(logits[i], r.temperature, r.top_p, row.generator)
        return tokens

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

    def _advance_row(self, row: RunningRow, token: int, llm: bool, handed: bool, entropy: float,
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
            self._forget(row.request.request_id)
        return Event(row.request.request_id, token, t.roles[-1], reason is not None, reason,
                     trace=t if reason is not None else None)

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._known.discard(request_id)

    def _drop(self, index: list[int]) -> None:
        """Remove finished rows from the batch, then trim columns that are padding in every row."""
        if not index:
            return
        gone = set(index)
        keep = torch.tensor([i for i in range(len(self._rows)) if i not in gone], dtype=torch.long)
        for i in index:
            slot = int(self._slots[i])
            self.policy.pins.pop(slot, None)
            if self.thresholds is not None:
                self.thresholds.thresholds.pop(slot, None)
        self._rows = [row for i, row in enumerate(self._rows) if i not in gone]
        self._ahead = keep_ahead(self._ahead, keep) if self._rows else None  # no rows: the lanes start afresh
        self._slots = self._slots[keep]
        self._routing.keep(keep)
        at = to_device(keep, self.device)
        self._seq, self._mask = self._seq[at], self._mask[at]
        for lane in self.lanes.values():
            lane.keep_rows(keep)
        self._trim()

    def _trim(self, at_least: int = 1) -> None:
        """Drop leading columns that are padding in every row (when there are ``at_least`` of them)."""
        if self._rows:
            n = min(row.pad for row in self._rows)
            if n >= at_least:
                self._seq, self._mask = self._seq[:, n:], self._mask[:, n:]
                for lane in self.lanes.values():
                    lane.trim_left(n)
                for row in self._rows:
                    row.pad -= n

