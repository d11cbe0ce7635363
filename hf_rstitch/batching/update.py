"""The update: one step's outputs (:class:`~.executor.StepOutput`, on the host) turned into request events.

For every row of the step, in batch order: a row whose own sampling failed ends alone with an ``error`` event; a
row held for the LLM (a schedule) gains no token and remembers its hand-over for the token the LLM writes later;
every other row records its token in its trace (which model wrote it, its entropy, the hand-over) and ends when the
token is one of its end ids (``stop``) or its ``max_new_tokens`` are written (``length``). Requests end through the
scheduler's :meth:`~.scheduler.Scheduler.finish`; the rows that ended are returned, to leave the batch.
"""

from __future__ import annotations

from typing import Callable

from ..core.roles import Role
from .executor import StepOutput
from .request_types import Event, RequestState


_LLM, _SLM = Role.LLM, Role.SLM  # a module constant: an enum member's lookup costs a few times more, per row


def update_from_output(rows: list[RequestState], out: StepOutput, finish: Callable[..., Event]
                       ) -> tuple[list[Event], list[int]]:
    """The events of one step for ``rows`` (the plan's, in batch order), and the rows that ended (indices).
    One pass over plain host lists: at hundreds of rows a step this loop is host time the device may wait on."""
    for i, call in out.calls:
        rows[i].trace.calls.append(call)
    events, done = [], []
    failed, held = out.failed, out.held
    odd = bool(failed or held)  # rows that gain no token this step: looked up only when some exist
    for i, (row, token, llm, handed, h, slm_h) in enumerate(zip(rows, out.tokens, out.writer_llm, out.handed,
                                                                 out.entropy, out.slm_entropy)):
        if odd and i in failed:  # this row alone: it leaves with an error, the others go on
            events.append(finish(row, "error", error=failed[i]))
            done.append(i)
            continue
        if odd and i in held:  # no token: remember the hand-over for the token the LLM writes later
            row.held = row.held or (handed, slm_h)
            continue
        event = _advance(row, token, llm, handed, h, slm_h, finish)
        events.append(event)
        if event.finished:
            done.append(i)
    return events, done


def _advance(row: RequestState, token: int, llm: bool, handed: bool, entropy: float, slm_h: float | None,
             finish: Callable[..., Event]) -> Event:
    if row.held is not None:  # the LLM's token after waiting: the hand-over happened when it began to wait
        (handed, slm_h), row.held = row.held, None
    reason = row.ending(token)
    t, role = row.trace, (_LLM if llm else _SLM)
    t.roles.append(role)
    t.handovers.append(handed)
    t.entropies.append(entropy)
    t.slm_entropies.append(slm_h if (not llm or handed) else None)
    row.output.append(token)
    if reason is not None:
        return finish(row, reason, token=token)
    return Event(row.request.request_id, token, role)
