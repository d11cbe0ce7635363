"""The stitched decode loop (the seed paper's Algorithm 1) for one ``generate`` call.

Per step, every row of the caller's batch gains one token, as in plain ``generate``:

1. :func:`~hf_rstitch.decode.step.run_step` runs the lanes and lets the policy pick each row's
   writer -- where a switch is decided: its two ``policy.hand_to_*`` calls, nowhere else.
2. The writer logits of the *whole* batch (the caller's rows, in the caller's order) go through
   the logits processors; a token is picked; finished rows get the pad token; the stopping
   criteria see the whole batch. Processors, stopping criteria and streamers therefore see
   exactly what plain ``generate`` shows them.

Finished rows: plain ``generate`` keeps running them. Here they leave the lanes (no model runs
for them) when nothing can tell (``drop_finished``: no scores or logits returned and only
transformers' own row-wise processors and criteria); their processor input is then zeros
instead of logits, and their token is the pad token either way. Otherwise they keep running,
routed by the policy as before, so their scores equal plain ``generate``'s; they are left out
of the traces either way.

Run-ahead: when the next step's first lane call is known before this step's stopping check -- the
SLM's, if any row's token was the SLM's (that row stays with the SLM) or the policy sent a row back
on the host; the LLM's, if it wrote every row's token and the policy kept every row with it on the
host -- a lane that allows it (``run_ahead``: the fast engine's graphs) is advanced before that
check and its host wait (:func:`run_ahead`): the device decodes the next token while the host
records this one. A lane runs every row either way, so the early call serves the next step whoever
takes part; its records are made then (``account``). If rows finished meanwhile, their part of the
early call is dropped; if every row finished, the whole call is (the lane has read one column more,
which the next generation's reset forgets). Where the LLM wrote every row and its decisions are on the device (a GPU
policy's) the lane is not known before the step's one wait; it is known right after it, so the call runs then,
before the host records the step (where no row ends at it). Outputs and traces do not change.

Decisions read a step late (``guess``, lanes whose ``ahead_of_decisions`` allows it: the fast engine on CUDA,
where the policy decides on the device -- the entropy rule, the router): the host learns a step's routing
decisions from a page-locked copy with the stopping flags, one wait a step, after the next step is queued.

* Every row is the SLM's: the step returns without reading the SLM's hand-over decisions (``StepOut.guess``), as
  if every row kept its proposal; its token is picked, the stopping check queued and the SLM's next step run
  ahead over that token. Where the decisions hand no row over, that is the step. Where some row was handed over,
  the guess is undone -- the SLM's early call rolled back (``crop``: its cache's write offset moves back, no copy),
  the random state the sampled tokens drew from restored -- and the step is finished as it would have been had
  the host read the decisions first (:func:`~hf_rstitch.decode.step.settle`): the handed rows run the LLM, the
  tokens are picked again, the processors and stopping criteria called again (they must be pure) and only then
  shown to ``on_token``. The policy is asked once either way.
* Every row is the LLM's: the LLM's next step is run ahead, as if it kept its rows. Its token is kept either way,
  so the call is right for any row it keeps; where it hands every row back, the call is rolled back (the next
  step may not call the LLM, whose cache then reads on as if it had not run).

Lanes left to themselves (``ahead_of_decisions=None``) guess only while it pays: a failed guess costs one step of
the lane, not guessing the host's read-back gap (:class:`~hf_rstitch.core.guessing.GuessGate`, which sees every
decision read). Tokens, scores, routes and traces do not change: the guess is only ever kept where it was right. A policy that
decides on the host (a host tensor: a replayed route, a custom policy that reads its inputs back) is read before
the next step as before; so is everything where ``guess`` is False (the ``generate`` glue's choice where a logits
processor or stopping criterion is not known to be pure).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import torch

from ..core.guessing import GuessGate
from ..core.policies import RoutingPolicy
from ..core.roles import Role
from ..core.sampling import pick_tokens
from ..core.trace import StitchTrace
from .emitted import MaskRoom, TraceBook
from .step import Ahead, Routing, StepOut, call_early, decides_late, roll_back, run_step, settle, to_device

# (sequence [B, T], raw logits [B, V]) -> processed scores [B, V]
Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (sequence [B, T], processed scores [B, V]) -> done [B] bool
Stopper = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StitchResult:
    sequences: torch.Tensor  # [B, T_prompt + new], finished rows padded with pad_token_id
    traces: list[StitchTrace]  # one per row
    scores: list[torch.Tensor] = field(default_factory=list)  # per step, [B, V] processed
    logits: list[torch.Tensor] = field(default_factory=list)  # per step, [B, V] raw


def stitch_loop(engine, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy: RoutingPolicy,
                process: Processor | None, should_stop: Stopper, do_sample: bool = False, pad_token_id: int = 0,
                on_token: Callable[[torch.Tensor], None] | None = None, keep_scores: bool = False,
                keep_logits: bool = False, drop_finished: bool = True, guess: bool = True) -> StitchResult:
    """Decode until ``should_stop`` says so for every row, alternating the SLM and LLM lanes.

    Args:
        engine: the pair's built engine (:class:`hf_rstitch.engine.Engine`), whose ``lanes()`` the loop runs on,
            or those lanes themselves: ``{Role.SLM: lane, Role.LLM: lane}``, fresh (nothing seen yet), sized for the
            batch.
        input_ids: ``[B, T]`` prompt ids (left-padded when rows differ in length).
        attention_mask: ``[B, T]`` prompt mask.
        policy: decides the hand-overs (see :mod:`hf_rstitch.core.policies`).
        process: logits processor, called on the whole batch each step; None: none (the scores are the
            logits, and greedy tokens may come from the lanes, which found them reading the logits out).
        should_stop: stopping rule on (sequence, processed scores) -> ``[B]`` done, whole batch.
        do_sample: sample instead of argmax.
        pad_token_id: the token of rows that already finished.
        on_token: called with each step's tokens ``[B]`` (pad for finished rows), e.g. streamers.
        keep_scores / keep_logits: keep processed scores / raw logits of every step.
        drop_finished: stop running finished rows through the models (see the module docstring).
        guess: lanes that decide late may go on before a step's routing decisions reach the host (see the module
            docstring); ``process`` and ``should_stop`` must then be pure functions of their inputs: a guessed step
            undone at a hand-over calls them again. False: every decision is read before the next step is queued.
    """
    run = _Generation(engine if isinstance(engine, dict) else engine.lanes(), input_ids, attention_mask, policy, guess)
    pick = _Picker(process, should_stop, do_sample, pad_token_id, on_token is not None)
    kept = ([] if keep_scores else None), ([] if keep_logits else None)  # (scores, logits) of every step
    policy.reset()
    for index in itertools.count():
        step = _decided_step(run, pick, index)  # the lanes, the tokens, the step's one wait
        _record(run, step, on_token, kept)
        if bool(step.done.any()) and not _rows_finished(run, step, drop_finished):  # else nothing else to update
            break
    return StitchResult(run.seq, run.book.finish(), kept[0] or [], kept[1] or [])


class _Picked(NamedTuple):
    """One step's tokens as the caller sees them (``[B]`` rows, the caller's order)."""

    logits: torch.Tensor  # [B, V] the writers' raw logits (zeros for rows out of the lanes)
    scores: torch.Tensor  # [B, V] processed
    tokens: torch.Tensor  # [B] pad for finished rows
    longer: torch.Tensor  # [B, T + 1] the sequence with the tokens appended
    wide: torch.Tensor  # [B, T + 1] its mask
    stop: torch.Tensor  # [B] should_stop's flags, on the device


class _Step(NamedTuple):
    """One step with its decisions on the host."""

    out: StepOut
    picked: _Picked
    accounted: torch.Tensor  # [b] bool host: the lane rows whose calls are recorded
    done: torch.Tensor  # [B] bool host: should_stop's flags
    back: torch.Tensor | None  # [b] bool host: the LLM hands the row back (None: no LLM ran)
    shown: torch.Tensor | None  # [B] the tokens on the host, for on_token


class _Generation:
    """What one ``stitch_loop`` call keeps from step to step: the lanes and policy, the caller's rows (all of
    them, all along) and where they sit in the lanes, the routing, the traces, the early lane call."""

    def __init__(self, lanes: dict, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy: RoutingPolicy,
                 guess: bool):
        batch = input_ids.shape[0]
        self.lanes, self.policy, self.batch = lanes, policy, batch
        self.seq, self.mask = input_ids, attention_mask  # [B, T]: the caller's rows, all of them, all along
        self.room = MaskRoom(attention_mask)
        self.unfinished = torch.ones(batch, dtype=torch.bool)  # [B] host
        self.in_lanes = torch.arange(batch)  # [b] caller row of each lane row
        self.at = None  # in_lanes on the device, once rows have left the lanes (copied once per change, not per step)
        self.live = None  # [B] unfinished on the device, once a row has finished (derived there: no per-step copy)
        self.routing = Routing.start(batch)
        self.book = TraceBook(batch, repr(policy))
        self.ahead = None  # the next step's first lane call, run early (run_ahead)
        self.flags = _HostFlags(batch)
        self.every = torch.ones(batch, dtype=torch.bool)  # [B] host, read only: `accounted` while no row has finished
        self.gate = GuessGate() if guess else None  # when a guess pays (lanes whose ahead_of_decisions is None)

    def accounted(self) -> torch.Tensor:
        """``[b]`` bool host: the lane rows whose calls are recorded (the unfinished ones)."""
        return self.every if self.live is None else self.unfinished[self.in_lanes]

    def in_lane_rows(self, seq: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq`` / ``mask`` of the caller's rows cut to the rows in the lanes."""
        return (seq, mask) if self.at is None else (seq[self.at], mask[self.at])


class _Picker:
    """The caller's side of a step: the logits processor, the token pick and the stopping rule, over every row."""

    def __init__(self, process: Processor | None, should_stop: Stopper, do_sample: bool, pad_token_id: int,
                 show: bool):
        self.process, self.should_stop, self.do_sample = process, should_stop, do_sample
        self.pad_token_id, self.show = pad_token_id, show  # show: on_token wants the tokens on the host

    def __call__(self, run: _Generation, out: StepOut) -> _Picked:
        at, seq = run.at, run.seq
        logits = out.logits
        if at is not None:  # rows out of the lanes get zeros
            logits = logits.new_zeros(run.batch, logits.shape[-1]).index_copy_(0, at, logits)
        scores = logits if self.process is None else self.process(seq, logits)
        found = out.greedy if self.process is None and not self.do_sample and at is None else None  # the lanes' argmax
        tokens = found if found is not None else pick_tokens(scores, self.do_sample)  # [B]
        if run.live is not None:
            tokens = torch.where(run.live, tokens, torch.full_like(tokens, self.pad_token_id))
        longer = torch.cat([seq, tokens[:, None]], dim=-1)
        wide = run.room.take(longer.shape[1])
        return _Picked(logits, scores, tokens, longer, wide, self.should_stop(longer, scores))


def _decided_step(run: _Generation, pick: _Picker, index: int):
    """One step up to its decisions on the host: the lanes run (:func:`run_step`), the tokens are picked, the stopping
    flags (and decisions) queued to the host before the next step's early call (:func:`run_ahead`), then the step's
    one wait. A guessed step that meets a hand-over is undone and settled (the module docstring), so the loop body
    runs once, or twice."""
    accounted = run.accounted()
    here = run.in_lane_rows(run.seq, run.mask)
    out = run_step(run.lanes, *here, run.routing, run.policy, index, run.in_lanes, accounted, ahead=run.ahead,
                   guess=run.gate)
    while True:  # once; twice where a guessed step meets a hand-over and is undone
        draws = _Draws(out.logits.device, pick.do_sample and out.guess is not None)
        picked = pick(run, out)
        decided = out.back if out.guess is None else out.guess
        run.flags.start(picked.stop, decided, picked.tokens if pick.show else None)  # queued before any early call
        run.ahead = run_ahead(run.lanes, out, *run.in_lane_rows(picked.longer, picked.wide), run.policy.needs_hidden,
                              guess=run.gate)
        done, decided, shown = run.flags.wait()  # the step's one wait for the device
        if out.guess is None or not bool(decided.any()):
            break
        roll_back(run.lanes, run.ahead)  # a row was handed over: the SLM's token and its early call are undone
        draws.restore()
        out = settle(run.lanes, out, decided, *here, run.routing, run.policy, index, run.in_lanes, accounted)
    back = None if out.guess is not None else decided  # a guess kept: no LLM ran
    run.ahead = settle_ahead(run.lanes, out, back, run.ahead, run.gate)
    if run.ahead is None and back is not None and on_device(out.back) and not bool((done & run.unfinished).any()):
        # nothing ran ahead because the LLM's decisions were on the device: its lane is known now, so its call runs
        # while the host records this step and prepares the next (no row ends here: a leaving row's call is wasted)
        run.ahead = run_ahead(run.lanes, replace(out, back=back), *run.in_lane_rows(picked.longer, picked.wide),
                              run.policy.needs_hidden)
    return _Step(out, picked, accounted, done, back, shown)


def _record(run: _Generation, step: _Step, on_token, kept: tuple) -> None:
    """The step's tokens join the sequence; the streamer, the traces, the kept scores and logits and the routing
    see them."""
    out, picked = step.out, step.picked
    run.seq, run.mask = picked.longer, picked.wide
    if on_token is not None:
        on_token(step.shown)
    run.book.record(run.in_lanes, step.accounted, out, run.live is None)
    for into, value in zip(kept, (picked.scores, picked.logits)):
        if into is not None:
            into.append(value)
    run.routing.after(out.writer_llm, step.back, no_llm=out.no_llm)


def _rows_finished(run: _Generation, step: _Step, drop_finished: bool) -> bool:
    """Rows done at this step finish: their tokens are the pad token from now on and, with ``drop_finished``, they
    leave the lanes. False where every row has finished."""
    run.unfinished = run.unfinished & ~step.done
    if not run.unfinished.any():
        return False
    tokens = step.picked.tokens
    live = torch.ones_like(tokens, dtype=torch.bool) if run.live is None else run.live
    run.live = live & ~step.picked.stop.to(tokens.device).bool()
    if drop_finished and not bool(run.unfinished[run.in_lanes].all()):
        run.in_lanes, run.ahead = _drop_finished(run.lanes, run.routing, run.unfinished, run.in_lanes, run.ahead)
        run.at = run.in_lanes.to(run.seq.device)
    return True
def settle_ahead(lanes: dict, out: StepOut, back: torch.Tensor | None, ahead: Ahead | None, gate) -> Ahead | None:
    """The step's early call once its decisions are on the host: an LLM call guessed (it keeps its rows) is rolled
    back where the LLM handed every row back (the next step may not call it). The gate sees how the step's
    decisions went against a guess: the SLM's, where every row was the SLM's; the LLM's, where it wrote every row."""
    if gate is None:
        return ahead
    if out.slm_alone:
        gate.saw(Role.SLM, not out.no_llm)  # some row handed over
    if back is None or not out.all_llm:
        return ahead
    every_back = bool(back.all())
    gate.saw(Role.LLM, every_back)
    if every_back and ahead is not None and ahead.role is Role.LLM and ahead.since is not None:
        roll_back(lanes, ahead)
        return None
    return ahead


def _drop_finished(lanes: dict, routing: Routing, unfinished: torch.Tensor, in_lanes: torch.Tensor, ahead):
    """Finished rows leave the lanes, the routing and a run-ahead output; returns the rows left
    (caller row of each lane row) and the cut run-ahead output."""
    keep = unfinished[in_lanes].nonzero().flatten()
    routing.keep(keep)
    for lane in lanes.values():
        lane.keep_rows(keep)
    return in_lanes[keep], keep_ahead(ahead, keep)


def on_device(decisions: torch.Tensor | None) -> bool:
    """Whether a step's routing decisions are still on a device: the host has not read them (a GPU policy's)."""
    return decisions is not None and decisions.device.type != "cpu"


def next_lane(out: StepOut, late: bool = False, llm_keeps: bool = False) -> Role | None:
    """The lane the step after ``out`` calls first, if the host knows it now: the SLM's when some row will
    be the SLM's (it wrote the row's token, or the LLM hands the row back and the policy said so on the
    host); the LLM's when it keeps every row and the host knows it, or when it wrote every row and keeps one
    whatever it decides (``llm_keeps``: a row pinned to it); else None (the LLM's decision to hand back is
    still on the device, or ``late``: the loop reads it a step late wherever it is)."""
    back = out.back
    if back is None or late or on_device(back):
        every_llm = out.all_llm if out.all_llm is not None else bool(out.writer_llm.all())
        return Role.SLM if not every_llm else Role.LLM if llm_keeps else None
    llm_next = out.writer_llm & ~back
    return Role.LLM if bool(llm_next.all()) else Role.SLM


def run_ahead(lanes: dict, out: StepOut, seq: torch.Tensor, mask: torch.Tensor, want_hidden: bool,
              guess: GuessGate | None = None, llm_keeps: bool = False, slm_joined: bool = False) -> Ahead | None:
    """The next step's first lane call over ``seq`` (this step's tokens appended), run now, when the host
    knows which lane it is (:func:`next_lane`; ``llm_keeps``: the LLM keeps a row whatever it decides;
    ``slm_joined``: rows that start with the SLM joined after ``out``'s calls, so the SLM's is next) and that
    lane allows it; else None. With ``guess`` (the loop's gate),
    also where the LLM's hand-back decisions are read a step late (its lane :func:`decides_late`) and it wrote every
    row's token: the LLM, guessing it keeps every row. A call after a guessed step (``out.guess``) or a guessed LLM call is itself
    a guess (``Ahead.since`` set): the caller undoes it (:func:`roll_back`) where the decision went the other way."""
    late = guess is not None and out.back is not None and decides_late(lanes[Role.LLM], out.back, guess)
    role, guessed = Role.SLM if slm_joined else next_lane(out, late, llm_keeps), out.guess is not None
    if role is None and late:
        role, guessed = Role.LLM, True
    if role is None:
        return None
    lane = lanes[role]
    if lane.capacity is not None and seq.shape[1] > lane.capacity:  # a last step past the cache: never needed
        return None
    return call_early(lane, seq, mask, want_hidden and role is Role.SLM, guessed)


def keep_ahead(ahead: Ahead | None, keep: torch.Tensor) -> Ahead | None:
    """A run-ahead output cut to the lane rows ``keep`` (CPU long)."""
    if ahead is None:
        return None
    hidden = ahead.hidden.index_select(0, to_device(keep, ahead.hidden.device)) if ahead.hidden is not None else None
    rows = ahead.rows[keep] if ahead.rows is not None else None
    return Ahead(ahead.role, ahead.logits.index_select(0, to_device(keep, ahead.logits.device)), hidden, ahead.since,
                 rows)


class _HostFlags:
    """Each step's stopping flags (and the LLM's hand-back decisions) on their way to the host.

    On CUDA the copy goes to a kept page-locked buffer and an event marks its end, so :meth:`wait`
    waits for the kernels queued before it, not for an early SLM call queued after it; elsewhere it is
    a plain copy. ``back`` on another device than the flags (a model split over GPUs) is copied apart.
    """

    def __init__(self, batch: int):
        self.buffer: torch.Tensor | None = None  # [2 * batch] bool, pinned, made at the first CUDA step
        self.event: torch.cuda.Event | None = None  # marks the copy's end; recorded again each step
        self.batch = batch
        self.tokens: torch.Tensor | None = None  # [batch] long, pinned: the step's tokens for ``on_token``
        self.pending = None

    def start(self, finished: torch.Tensor, back: torch.Tensor | None, tokens: torch.Tensor | None = None) -> None:
        """Queue the copies of ``finished`` and ``back`` (``[b]`` bool) and, where given, the step's ``tokens``."""
        rows = len(finished)
        apart = back.cpu() if back is not None and back.device != finished.device else None
        both = finished.bool() if back is None or apart is not None else torch.cat([finished.bool(), back])
        if both.device.type != "cuda":
            tokens = tokens.cpu() if tokens is not None else None
            self.pending = (both.cpu(), None, rows, back is not None and apart is None, apart, tokens)
            return
        if self.buffer is None:
            self.buffer = torch.empty(2 * self.batch, dtype=torch.bool, pin_memory=True)
            self.event = torch.cuda.Event()
        host = self.buffer[: len(both)]
        host.copy_(both, non_blocking=True)
        if tokens is not None:
            if self.tokens is None:
                self.tokens = torch.empty(self.batch, dtype=tokens.dtype, pin_memory=True)
            tokens = self.tokens[: len(tokens)].copy_(tokens, non_blocking=True)
        self.event.record(torch.cuda.current_stream(both.device))  # the flags' device, not the current one
        self.pending = (host, self.event, rows, back is not None and apart is None, apart, tokens)

    def wait(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(done, back, tokens)`` on the host, the last None where :meth:`start` was given none."""
        host, event, rows, with_back, apart, tokens = self.pending
        if event is not None:
            event.synchronize()
            host = host.clone()  # the page-locked buffers are reused by the next step
            tokens = tokens.clone() if tokens is not None else None
        done = host if host.shape[0] == rows else host[:rows]  # no view op where the flags are all there is
        return done, (host[rows:] if with_back else apart), tokens


class _Draws:
    """The state of the random numbers a step's sampled tokens draw from (the default generator of the scores'
    device), kept before a guessed step draws (``keep``) and restored where the guess is undone: the step then
    draws again from the same state, as it would have had it read its decisions first."""

    def __init__(self, device: torch.device, keep: bool):
        self.device = device
        self.state = None
        if keep:  # no device sync: a CUDA generator's state (seed, offset) lives on the host
            self.state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()

    def restore(self) -> None:
        if self.state is None:
            return
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(self.state, self.device)
        else:
            torch.set_rng_state(self.state)
