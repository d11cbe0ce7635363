"""One stitched step over the rows of a batch: run the lanes, ask the policy, pick each row's writer.

This is where every switch is decided -- the two ``policy.hand_to_*`` calls in :func:`run_step`:

1. Rows the SLM controls run the SLM (partial prefill + next-token logits); the policy decides
   per row whether to keep its proposal or discard it (hand-over to the LLM).
2. Rows the LLM controls -- or that were just handed over -- run the LLM; its token is always
   kept, and the policy decides per row whether control returns to the SLM for the next step.

A schedule (:mod:`hf_rstitch.core.scheduling`, the request engine's option) may defer step 2: then
the rows that need the LLM gain no token this step (``StepOut.held``) and wait for a later LLM call
that serves more of them. Which model decides each token does not change, only when.

The step knows nothing about logits processors, stopping or finished rows: the callers (the
``generate`` loop in :mod:`.loop`, the request engine in :mod:`.requests`) pick the tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..core.guessing import GuessGate
from ..core.policies import RoutingPolicy, StepView
from ..core.roles import Role
from ..core.scheduling import LLMDemand, LLMSchedule
from ..core.trace import ForwardCall


@dataclass
class Routing:
    """Who controls each row of the lanes, on the host (``[b]`` bool each)."""

    llm_on: torch.Tensor  # the LLM decodes the row's next token
    last_llm: torch.Tensor  # the LLM wrote the row's latest token
    waited: torch.Tensor  # [b] long: steps the row has waited for the LLM (a schedule deferred it)
    waiting: bool = False  # some row of ``waited`` may be nonzero (else the generate loop's steps skip zeroing it)
    slm_only: bool = False  # no row is the LLM's, known on the host without reading ``llm_on`` (False: not known)

    @classmethod
    def start(cls, rows: int) -> "Routing":
        """Every row starts with the SLM (the seed paper's Algorithm 1)."""
        return cls(torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.bool),
                   torch.zeros(rows, dtype=torch.long), slm_only=True)

    def after(self, writer_llm: torch.Tensor, back: torch.Tensor | None, held: torch.Tensor | None = None,
              no_llm: bool | None = None) -> None:
        """Record who wrote this step's tokens; LLM rows handed back give control to the SLM.
        ``held`` rows wrote nothing: they keep waiting for the LLM. ``no_llm``: the host knows no row's token
        was the LLM's (``StepOut.no_llm``). Rows past the step's (they joined after its calls were queued: the
        request engine's joins ahead) keep the routing they joined with."""
        joined = len(self.llm_on) - len(writer_llm)
        if joined > 0:
            first = self.llm_on[-joined:].tolist()
            self.keep(torch.arange(len(writer_llm)))
            self.after(writer_llm, back, held, no_llm)
            self.add(first)
            return
        self.slm_only = bool(no_llm) and held is None
        if held is not None:  # the LLM did not run: held == writer_llm, every other row is the SLM's
            self.waited = torch.where(held, self.waited + 1, 0)
            self.waiting = True
            self.last_llm = self.last_llm & held
            self.llm_on = held
            return
        if self.waiting:
            self.waited.zero_()
            self.waiting = False
        self.last_llm = writer_llm
        self.llm_on = writer_llm & ~back if back is not None else writer_llm

    def keep(self, index: torch.Tensor) -> None:
        self.llm_on, self.last_llm, self.waited = self.llm_on[index], self.last_llm[index], self.waited[index]

    def add(self, llm_first: list[bool]) -> None:
        """Append rows; each starts with the SLM unless ``llm_first`` (a row pinned to the LLM)."""
        first = torch.tensor(llm_first, dtype=torch.bool)
        self.slm_only = self.slm_only and not any(llm_first)
        self.llm_on = torch.cat([self.llm_on, first])
        self.last_llm = torch.cat([self.last_llm, torch.zeros_like(first)])
        self.waited = torch.cat([self.waited, torch.zeros(len(first), dtype=torch.long)])


@dataclass
class StepOut:
    """One step's outcome per lane row (``[b]``); the writer is the model whose token is kept."""

    logits: torch.Tensor  # [b, V] raw logits of each row's writer
    entropy: torch.Tensor  # [b] writer's normalized entropy (on the logits' device)
    writer_llm: torch.Tensor  # [b] bool, host: the LLM writes the row's token
    handed: torch.Tensor | None  # [b] bool, host: the SLM's proposal was discarded (None: SLM did not run)
    slm_entropy: torch.Tensor | None  # [b] the SLM's entropy where it ran
    back: torch.Tensor | None  # [b] bool (any device): after its token the LLM hands back (None: LLM did not run)
    calls: list[tuple[int, ForwardCall]]  # (lane row, call) for every accounted row
    held: torch.Tensor | None = None  # [b] bool, host: rows that gain no token this step (waiting for the LLM)
    greedy: torch.Tensor | None = None  # [b] long: argmax of ``logits``, where the lanes found it (read-out)
    all_llm: bool | None = None  # writer_llm.all() and not writer_llm.any(), on the host (None: not known)
    no_llm: bool | None = None
    slm_logits: torch.Tensor | None = None  # [b, V] the SLM's logits where it ran
    slm_alone: bool = False  # every row was the SLM's before the step (its decisions were the only ones)
    guess: torch.Tensor | None = None  # [b] bool on the device: the SLM's hand-over decisions, not read yet (settle)


@dataclass
class Ahead:
    """A lane's ``advance`` run a step early (the loop's run-ahead, :func:`hf_rstitch.decode.loop.run_ahead`)
    with no rows taking part: its records are made when the step that uses it knows its rows."""

    role: Role
    logits: torch.Tensor  # [b, V]
    hidden: torch.Tensor | None
    since: int | None = None  # a guess (run before a decision it depends on reached the host): columns the lane
    # had read before it, where a roll-back takes it (``crop``); None: the host knew the call was needed
    rows: torch.Tensor | None = None  # [b] bool CPU: the rows whose logits it holds (a lane's ``ran``); None: all


def run_step(
    lanes: dict, seq: torch.Tensor, mask: torch.Tensor, routing: Routing, policy: RoutingPolicy,
    index: int, rows: torch.Tensor, accounted: torch.Tensor | None = None, schedule: LLMSchedule | None = None,
    ahead: Ahead | None = None, guess: GuessGate | None = None,
) -> StepOut:
    """Advance the lanes by one token for every row of ``seq [b, T]`` and choose each row's writer.

    Args:
        lanes: ``{Role.SLM: lane, Role.LLM: lane}`` holding exactly these ``b`` rows.
        seq, mask: ``[b, T]`` the rows' shared columns (left-padded) and attention mask.
        routing: the rows' control state (read here; the caller applies :meth:`Routing.after`).
        policy: decides the hand-overs.
        index: position of the token being decided among the new tokens (``StepView.index``).
        rows: ``[b]`` CPU long, the caller's id of each row (``StepView.rows``).
        accounted: ``[b]`` bool (CPU), rows whose forward calls are recorded (default: all); rows
            that only run so their logits exist (finished rows, kept as plain ``generate`` keeps
            them) are left out.
        schedule: whether the LLM runs now for the rows that need it (default: always); when it
            does not, those rows are ``held`` and the caller moves them one column right
            (``hold_rows`` of each lane) instead of appending a token.
        ahead: one lane's ``advance`` for these rows, already run (the loop's run-ahead): used instead
            of advancing that lane. Unused when the rows that needed it finished meanwhile: the lane
            has read the column early, which its next call skips; no records were made.
        guess: the ``generate`` loop's gate (:class:`~hf_rstitch.core.guessing.GuessGate`; None: never guess).
            When every row is the SLM's and its lane decides late (:func:`decides_late`), the step returns without
            reading the SLM's hand-over decisions: the outcome as if no row were handed over, the decisions still on
            the device in ``StepOut.guess``; the caller reads them later and, where some row was handed over,
            finishes the step with :func:`settle`.
    """
    accounted = _every(len(rows)) if accounted is None else accounted
    llm_on, calls = routing.llm_on, []
    some_llm = not routing.slm_only and bool(llm_on.any())  # host flags read once: a tensor op costs microseconds
    slm_rows = ~llm_on if some_llm else None  # None: every row is the SLM's
    slm = None
    if slm_rows is None or slm_rows.any():
        taking = accounted if slm_rows is None else slm_rows & accounted
        slm_logits, hidden, got = _advance(lanes[Role.SLM], ahead, seq, mask, taking, routing.last_llm,
                                           policy.needs_hidden, slm_rows)
        calls += got.items()
        slm_h = lanes[Role.SLM].entropy(slm_logits)
        decision = policy.hand_to_llm(StepView(index, slm_h, hidden, rows, slm_logits, seq))
        if guess is not None and slm_rows is None and decides_late(lanes[Role.SLM], decision, guess):
            slm = _SlmPart(slm_logits, slm_h, torch.zeros_like(llm_on), lanes[Role.SLM].greedy(slm_logits))
            out = _finish(lanes, seq, mask, routing, policy, index, rows, accounted, schedule, None, calls, slm, False)
            out.guess, out.slm_alone = decision, True
            return out
        pending = send_to_host(decision)  # queued before an early LLM call: waiting for it waits for no more
        if ahead is None or ahead.role is not Role.LLM:
            ahead = _llm_before_decision(lanes[Role.LLM], decision, some_llm, schedule, seq, mask, llm_on)
        handed = on_host(pending).bool() if slm_rows is None else on_host(pending) & slm_rows
        slm = _SlmPart(slm_logits, slm_h, handed)
    return _finish(lanes, seq, mask, routing, policy, index, rows, accounted, schedule, ahead, calls, slm, some_llm)


def settle(lanes: dict, out: StepOut, handed: torch.Tensor, seq: torch.Tensor, mask: torch.Tensor, routing: Routing,
           policy: RoutingPolicy, index: int, rows: torch.Tensor, accounted: torch.Tensor | None = None) -> StepOut:
    """The step :func:`run_step` returned guessed (``out.guess``), finished now that the host knows the SLM's
    decisions ``handed`` (``[b]`` bool CPU): the rows handed over run the LLM, as :func:`run_step` would have run
    them had it read the decisions at once. The policy is not asked again about the SLM's proposals."""
    accounted = _every(len(rows)) if accounted is None else accounted
    slm = _SlmPart(out.slm_logits, out.slm_entropy, handed.bool(), out.greedy)
    return _finish(lanes, seq, mask, routing, policy, index, rows, accounted, None, None, list(out.calls), slm, False)


def decides_late(lane, decision: torch.Tensor, gate: GuessGate | None = None) -> bool:
    """Whether the step may go on before ``lane``'s policy decision reaches the host: the lane runs ahead and rolls
    back, and its ``ahead_of_decisions`` is True, or None where the decision is on a device (not the host) and
    ``gate`` (:class:`~hf_rstitch.core.guessing.GuessGate`; None: any) says a guess of the lane's pays."""
    late = getattr(lane, "ahead_of_decisions", False)
    if not lane.run_ahead or late is False:
        return False
    return late is True or (decision.device.type != "cpu" and (gate is None or gate.pays(lane.role)))


@dataclass
class _SlmPart:
    """What the SLM's half of a step leaves for the rest: its logits, entropies, the rows handed over (host) and,
    where found already, its greedy tokens."""

    logits: torch.Tensor
    entropy: torch.Tensor
    handed: torch.Tensor
    greedy: torch.Tensor | None = None


def _finish(lanes: dict, seq, mask, routing: Routing, policy: RoutingPolicy, index: int, rows, accounted, schedule,
            ahead: Ahead | None, calls: list, slm: _SlmPart | None, some_llm: bool) -> StepOut:
    """The step after the SLM's half (``slm``; None: the SLM did not run): the LLM runs for its rows and those
    handed over, and each row's writer is picked. ``some_llm``: some row was the LLM's before the step."""
    llm_on, alone = routing.llm_on, slm is not None and not some_llm
    slm_h = handed = slm_logits = None
    if slm is not None:
        slm_logits, slm_h, handed = slm.logits, slm.entropy, slm.handed
        llm_on = llm_on | handed if some_llm else handed  # discard these proposals: the LLM decodes the same position
        some_llm = bool(llm_on.any())
    llm_h = back = llm_logits = held = None
    if some_llm and _llm_now(schedule, llm_on, routing.waited):
        llm_logits, _, got = _advance(lanes[Role.LLM], ahead, seq, mask, llm_on & accounted, ~routing.last_llm, False,
                                      llm_on)
        calls += got.items()
        llm_h = lanes[Role.LLM].entropy(llm_logits)
        back = policy.hand_to_slm(StepView(index, llm_h, rows=rows, logits=llm_logits, tokens=seq))  # host copy deferred to the caller's sync
    elif some_llm:
        held = llm_on.clone()  # no LLM call: these rows wait; their logits below are the SLM's, unused
    by_writer = _ByWriter(llm_on, some_llm)
    slm_greedy = slm.greedy if slm is not None else None
    return StepOut(by_writer(llm_logits, slm_logits), by_writer(llm_h, slm_h), llm_on, handed, slm_h, back, calls,
                   held, _greedy(lanes, by_writer, llm_logits, slm_logits, slm_greedy), by_writer.all, by_writer.none,
                   slm_logits=slm_logits, slm_alone=alone)


def _greedy(lanes: dict, by_writer: "_ByWriter", llm_logits, slm_logits, slm_greedy=None) -> torch.Tensor | None:
    """Each row's argmax of its writer's logits where the lanes that wrote found it reading them out (the fast
    lane's ``greedy``; the SLM's given as ``slm_greedy`` where found already), else None: the caller computes it."""
    found = {}
    for role, logits in ((Role.LLM, llm_logits), (Role.SLM, slm_logits)):
        if logits is not None:
            found[role] = slm_greedy if role is Role.SLM and slm_greedy is not None else lanes[role].greedy(logits)
            if found[role] is None:
                return None
    return by_writer(found.get(Role.LLM), found.get(Role.SLM))


def _llm_before_decision(lane, decision: torch.Tensor, some_llm: bool, schedule, seq, mask,
                         llm_on: torch.Tensor) -> Ahead | None:
    """The LLM's call, queued before the host reads the SLM's hand-over decisions from the device, when the
    step calls the LLM whatever they say (some row is the LLM's already) and its lane runs every row anyway
    (``run_ahead``): the device goes on from the SLM to the LLM instead of waiting for the host. ``some_llm``:
    some row is the LLM's before the decisions (``llm_on``: those rows; a lane that runs only the rows a call
    needs runs them, and the rows handed over in a second call once the decisions are read)."""
    if decision.device.type == "cpu" or schedule is not None or not some_llm:
        return None
    return call_early(lane, seq, mask, run=llm_on)


def call_early(lane, seq: torch.Tensor, mask: torch.Tensor, want_hidden: bool = False, guess: bool = False,
               run: torch.Tensor | None = None) -> Ahead | None:
    """``lane``'s next ``advance`` over ``seq``, queued before the host knows which rows take part, where the
    lane allows it (``run_ahead``: it runs every row anyway, or the rows ``run`` where it runs only the rows a
    call needs, ``compact``); else None. No rows take part in the call: the step that uses it makes their records
    (``Lane.account``). ``guess``: the call may be undone (``crop``, the columns the lane had read noted in
    ``Ahead.since``)."""
    if not lane.run_ahead:
        return None
    nobody, since = _nobody(seq.shape[0]), lane.seen if guess else None
    logits, hidden, _ = lane.advance(seq, mask, nobody, nobody, want_hidden=want_hidden, **_rows_of(lane, run))
    return Ahead(lane.role, logits, hidden, since, _ran(lane))


def _rows_of(lane, run: torch.Tensor | None) -> dict:
    """``advance``'s ``run=`` for a lane that runs only the rows a call needs (``compact``: the fast lane's
    :mod:`~hf_rstitch.fast.lane_compact`); other lanes run every row."""
    return {"run": run} if run is not None and hasattr(lane, "compact") else {}


def _ran(lane) -> torch.Tensor | None:
    """The rows whose logits the lane's last ``advance`` returned (None: every row)."""
    return lane.ran if getattr(lane, "compact", None) is not None else None


def roll_back(lanes: dict, ahead: Ahead | None) -> None:
    """Undo a guessed early call (``ahead.since`` set): its lane forgets the columns it read (``crop``: a position
    reset, not a copy); the call's outputs are dropped with it."""
    if ahead is not None and ahead.since is not None:
        lanes[ahead.role].crop(ahead.since)


@functools.lru_cache(maxsize=64)
def _nobody(rows: int) -> torch.Tensor:
    """``[rows]`` False on the host, made once a size (lanes read their ``rows`` / ``resumed``, never write them)."""
    return torch.zeros(rows, dtype=torch.bool)


@functools.lru_cache(maxsize=64)
def _every(rows: int) -> torch.Tensor:
    """``[rows]`` True on the host, made once a size (read only, as :func:`_nobody`)."""
    return torch.ones(rows, dtype=torch.bool)


def send_to_host(values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """``values``' copy to the host, queued now: on CUDA into page-locked memory, with an event after it."""
    if values.device.type != "cuda":
        return values, None
    host = values.to("cpu", non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(values.device))
    return host, done


def to_device(values, device: torch.device) -> torch.Tensor:
    """A CPU tensor (or a list of ints) on ``device`` without waiting for the kernels queued there: a blocking
    copy from the host waits for the device's stream, which holds a step run ahead (tens of ms); a
    non-blocking one from pageable memory is staged and queued at once."""
    values = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
    return values.to(device, non_blocking=True)


def on_host(pending: tuple[torch.Tensor, torch.cuda.Event | None]) -> torch.Tensor:
    """The copy :func:`send_to_host` queued, once there: waits for the kernels queued before it, not for a
    lane call queued after it."""
    host, done = pending
    if done is None:
        return host.cpu()
    done.synchronize()
    return host


def _advance(lane, ahead: Ahead | None, seq, mask, rows: torch.Tensor, resumed: torch.Tensor, want_hidden: bool,
             run: torch.Tensor | None = None):
    """``lane.advance(...)`` for the rows ``run`` (``[b]`` bool CPU; None: every row), or the lane's early call when
    ``ahead`` is it (then only its records are made, and the rows it did not run run now)."""
    if ahead is None or ahead.role is not lane.role:
        return lane.advance(seq, mask, rows, resumed, want_hidden=want_hidden, **_rows_of(lane, run))
    calls = lane.account(seq.shape[1], rows, resumed)
    if ahead.rows is None:
        return ahead.logits, ahead.hidden, calls
    rest = (run if run is not None else _every(len(rows))) & ~ahead.rows
    if not bool(rest.any()):
        return ahead.logits, ahead.hidden, calls
    nobody = _nobody(len(rows))
    logits, hidden, _ = lane.advance(seq, mask, nobody, nobody, want_hidden=want_hidden, run=rest)
    at = to_device(rest, logits.device)
    logits = torch.where(at[:, None], logits, ahead.logits)
    if hidden is not None and ahead.hidden is not None:
        hidden = torch.where(at.to(hidden.device)[:, None], hidden, ahead.hidden)
    return logits, hidden, calls


def _llm_now(schedule: LLMSchedule | None, llm_on: torch.Tensor, waited: torch.Tensor) -> bool:
    if schedule is None:  # the generate loop: every step
        return True
    need = int(llm_on.sum())
    if need == len(llm_on):  # waiting would stall every row: never
        return True
    return schedule.run_now(LLMDemand(need=need, rows=len(llm_on), waited=int(waited[llm_on].max())))


class _ByWriter:
    """Per row, the LLM's value where it writes and the SLM's elsewhere (either may be absent), for the step's
    logits, entropies and greedy tokens alike.

    ``writer_llm`` is ``[b]`` bool on the host. When every row has the same writer no mask goes to the
    device; otherwise it goes once per device, queued without waiting for the device's stream (``to_device``).
    """

    def __init__(self, writer_llm: torch.Tensor, some: bool):
        self.writer_llm = writer_llm  # ``some``: writer_llm.any(), known already
        self.none = not some
        self.all = some and bool(writer_llm.all())
        self._picks: dict[torch.device, torch.Tensor] = {}

    def __call__(self, llm_value: torch.Tensor | None, slm_value: torch.Tensor | None):
        if llm_value is None or slm_value is None:
            return slm_value if llm_value is None else llm_value
        if self.all:
            return llm_value
        if self.none:
            return slm_value
        pick = self._picks.get(llm_value.device)
        if pick is None:
            pick = self._picks[llm_value.device] = to_device(self.writer_llm, llm_value.device)
        return torch.where(pick.view(-1, *[1] * (llm_value.dim() - 1)), llm_value, slm_value)
