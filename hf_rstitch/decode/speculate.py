"""Speculative verification inside the LLM's runs (``stitch_speculate=k``): fewer LLM forwards, the same tokens.

While the LLM has control -- it wrote the latest token and its policy did not hand back -- the SLM drafts ``k``
tokens (its own argmax, ``k`` forwards) and the LLM reads them in one forward, which gives its logits at the
``k + 1`` positions after its latest token. The tokens are then decided position by position, exactly as
:func:`~hf_rstitch.decode.loop.stitch_loop` decides them one step at a time:

* the LLM's token at each position (its logits through the logits processor, then argmax) is kept, as in the
  stitched loop, where the LLM writes every token it decodes;
* R-Stitch's hand-back rule is asked at each kept position, in order (``policy.hand_to_slm`` on the LLM's
  entropy there, with the tokens before it): the run ends at the first position where it hands back, and the
  SLM writes the next token;
* the run also ends at the first position where the LLM's token differs from the draft (the drafts after it
  were read after a wrong token) and after the ``k + 1``-th position: HF assisted generation's greedy rule
  (longest matching prefix, plus the LLM's own next token).

The columns past the last kept token (rejected drafts) are cropped from both lanes' caches
(:meth:`~hf_rstitch.decode.lane.Lane.crop`). Steps where the SLM has control run :func:`~.step.run_step`
unchanged, so with speculation on, the tokens, the routes and the policy's calls are those without it; only the
forward calls differ: the trace counts them (``llm_forward_calls``) and the drafts (``drafted_tokens``,
``accepted_drafts``).

What it does not do: sampling (the speculative-sampling rejection rule is not implemented, so ``do_sample=True``
is refused), batches of more than one row (rows would keep different numbers of tokens in one shared sequence),
the fast engine (its static caches and graphs do not crop: :func:`hf_rstitch.engine.choose` refuses it by name,
``"auto"`` runs the eager lanes).
"""

from __future__ import annotations

import torch

from ..core.policies import RoutingPolicy, StepView
from ..core.roles import Role
from ..core.sampling import pick_tokens
from .emitted import MaskRoom, TraceBook
from .loop import Processor, StitchResult, Stopper
from .step import Routing, StepOut, run_step

_ROW = torch.zeros(1, dtype=torch.long)  # the one row's caller id
_ONE = torch.ones(1, dtype=torch.bool)  # [1] True on the host (read only)
_NONE = torch.zeros(1, dtype=torch.bool)


def check_speculation(k, batch: int, do_sample: bool) -> int:
    """``k`` as an int, or an error saying what is unsupported and what to do instead."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"stitch_speculate must be a whole number of draft tokens >= 0 (0: off), got {k!r}; "
                         "e.g. stitch_speculate=4.")
    if k and do_sample:
        raise ValueError("stitch_speculate verifies drafts greedily only (the speculative-sampling rejection rule is "
                         "not implemented), but do_sample=True; pass do_sample=False or drop stitch_speculate.")
    if k and batch != 1:
        raise ValueError(f"stitch_speculate runs one row at a time (rows would keep different numbers of drafts), but "
                         f"the batch has {batch} rows; call generate once per prompt or drop stitch_speculate.")
    return k


def speculative_loop(
    engine, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy: RoutingPolicy,
    process: Processor | None, should_stop: Stopper, k: int, max_length: int | None = None,
    on_token=None, keep_scores: bool = False, keep_logits: bool = False,
) -> StitchResult:
    """:func:`~hf_rstitch.decode.loop.stitch_loop` for one row, greedy, with the LLM's runs verified ``k`` drafts at
    a time (the module docstring). ``max_length``: no draft is made past it (the stopping rule ends there)."""
    check_speculation(k, input_ids.shape[0], False)
    lanes = engine if isinstance(engine, dict) else engine.lanes()
    for role, lane in lanes.items():
        if not callable(getattr(lane, "crop", None)):
            raise ValueError(f"stitch_speculate needs lanes that crop their caches (the eager engine's); the {role} "
                             f"lane is a {type(lane).__name__}. Use stitch_engine='default'.")
        lane.keep_past()
    emit = _Emitter(input_ids, attention_mask, policy, process, should_stop, on_token, keep_scores, keep_logits)
    routing = Routing.start(1)
    policy.reset()
    while not emit.done:
        if bool(routing.llm_on[0]):
            room = k if max_length is None else max(min(k, max_length - emit.seq.shape[1] - 1), 0)
            _verified_run(lanes, emit, policy, room, routing)
            continue
        out = run_step(lanes, emit.seq, emit.mask, routing, policy, emit.index, _ROW)
        emit.token(out)
        routing.after(out.writer_llm, out.back.cpu() if out.back is not None else None, no_llm=out.no_llm)
    return emit.result()


def draft(lane, seq: torch.Tensor, mask: torch.Tensor, k: int, resumed: torch.Tensor):
    """``k`` tokens the SLM proposes after ``seq [1, T]`` (its argmax, one forward each): ``[1, k]`` and the calls."""
    tokens, calls = [], []
    for i in range(k):
        logits, _, got = lane.advance(seq, mask, _ONE, resumed if i == 0 else _NONE)
        tokens.append(logits.argmax(-1))
        seq = torch.cat([seq, tokens[-1][:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones(1, 1)], dim=-1)
        calls += got.items()
    return (torch.stack(tokens, dim=-1) if tokens else seq[:, :0]), calls


def _verified_run(lanes: dict, emit: "_Emitter", policy: RoutingPolicy, k: int, routing: Routing) -> None:
    """One LLM run: ``k`` drafts, one LLM forward over them, the kept tokens emitted, the rest cropped."""
    slm, llm = lanes[Role.SLM], lanes[Role.LLM]
    seq, mask = emit.seq, emit.mask
    drafts, calls = draft(slm, seq, mask, k, _ONE)  # the LLM wrote the latest token: the SLM resumes
    wide = torch.cat([seq, drafts], dim=-1)
    logits, got = llm.verify(wide, torch.cat([mask, mask.new_ones(1, k)], dim=-1), k + 1, _ONE, _NONE)
    calls += got.items()
    entropy = llm.entropy(logits[0])  # [k + 1]: the LLM's at each position
    emit.drafted += k
    for i in range(k + 1):
        row_logits, h = logits[:, i], entropy[i: i + 1]
        back = policy.hand_to_slm(StepView(emit.index, h, rows=_ROW, logits=row_logits, tokens=emit.seq)).cpu()
        token = emit.token(StepOut(row_logits, h, _ONE, None, None, back, calls if i == 0 else []))
        kept_draft = i < k and bool(token[0] == drafts[0, i])
        emit.accepted += kept_draft
        routing.after(_ONE, back, no_llm=False)
        if emit.done or bool(back[0]) or not kept_draft:
            break
    seen = emit.seq.shape[1] - 1  # every column but the last token is right; nobody has read that one
    for lane in (slm, llm):
        lane.crop(min(lane.n_seen, seen))


class _Emitter:
    """The one row's tokens as the stitched loop emits them: processed scores, token, stopping rule, streamer,
    trace records, kept scores and logits."""

    def __init__(self, input_ids, mask, policy, process, should_stop, on_token, keep_scores, keep_logits):
        self.seq, self.mask, self.room = input_ids, mask, MaskRoom(mask)
        self.process, self.should_stop, self.on_token = process, should_stop, on_token
        self.book = TraceBook(1, repr(policy))
        self.drafted = self.accepted = 0  # draft tokens made, and kept
        self.scores, self.logits = ([] if keep_scores else None), ([] if keep_logits else None)
        self.index, self.done = 0, False

    def token(self, out: StepOut) -> torch.Tensor:
        """Emit the token ``out``'s writer decodes; returns it (``[1]``)."""
        scores = out.logits if self.process is None else self.process(self.seq, out.logits)
        token = pick_tokens(scores, False)
        self.seq = torch.cat([self.seq, token[:, None]], dim=-1)
        self.mask = self.room.take(self.seq.shape[1])
        if self.on_token is not None:
            self.on_token(token)
        self.done = bool(self.should_stop(self.seq, scores).any())
        self.book.record(_ROW, _ONE, out, True)
        for kept, value in ((self.scores, scores), (self.logits, out.logits)):
            if kept is not None:
                kept.append(value)
        self.index += 1
        return token

    def result(self) -> StitchResult:
        traces = self.book.finish()
        traces[0].drafted_tokens, traces[0].accepted_drafts = self.drafted, self.accepted
        return StitchResult(self.seq, traces, self.scores or [], self.logits or [])
