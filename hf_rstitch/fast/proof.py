"""The fast engine proven on the user's own machine: a short probe on the first ``"auto"`` call of an unproven pair.

Why: ``"auto"`` runs the fast engine only where it was shown equal to the eager engine (:mod:`.support`: the
architectures of the zoo, the GPUs it ran on). Most users' GPUs (T4, A100, RTX 3090, L4, 4090, B200, 5090) and
dtypes were never in those runs, so instead of refusing them, the first ``"auto"`` call of such a pair proves
the fast engine here: both engines are teacher-forced over the same tokens -- the last :data:`STEPS` tokens of
the user's own prompt, one at a time after a prefill of the rest -- and must agree on every row and step:

* log-probabilities of the eager engine's :data:`TOP` most likely tokens within the dtype's tolerance
  (:data:`TOLERANCE`: float32 1e-3, float16 0.05, bfloat16 0.15 nats, plus :data:`RELATIVE` of their size);
* normalized entropies (what the hand-over decision thresholds) within the dtype's entropy tolerance, so a
  threshold decides alike wherever it is not within that tolerance of the entropy (away from near-ties);
* the most likely token, wherever the eager engine's top two are further apart than the log-probability
  tolerance (away from near-ties).

Passed: the fast engine from then on, and the proof is stored (:mod:`.proof_store`, under the Hugging Face cache,
keyed by GPU, capability, profile, torch / Triton / transformers / hf_rstitch versions, model types and dtypes):
later processes skip the probe. Failed or crashed: :class:`ProofFailed` is raised from the lanes' first
``advance``, so the engine's one fallback (:meth:`hf_rstitch.engine.Engine.fall_back`) reruns the call on the eager engine,
logs the reason once and remembers the pair; the failure is stored too, and later processes run the eager
engine directly. ``HF_RSTITCH_PROVE=off`` turns this off (unproven pairs run the eager engine, as before).

The one entry point: :func:`unproven`, which the engine chooser (:func:`hf_rstitch.engine.choose`)
calls with its refusal. What it does not do: prove sharded or quantized models, CPU runs, or anything the fast
lanes cannot hold (:func:`.support.why_not_fast` with ``proven=False`` refuses those before).
"""

from __future__ import annotations

import logging
import os
import time

import torch

from ..core.roles import Role
from ..decode.lane import Lane
from . import proof_store, support

log = logging.getLogger("hf_rstitch.fast")
ENV = "HF_RSTITCH_PROVE"  # "off" / "0": unproven pairs run the eager engine (no probe)
STEPS = 8  # prompt tokens the probe reads one at a time (after a prefill of the rest)
TOP = 8  # the eager engine's most likely tokens whose log-probabilities are compared
# dtype -> (log-probability tolerance in nats, normalized-entropy tolerance): float32 differs only in summation
# order; float16 / bfloat16 round every product's output, which the engines' kernels order differently
TOLERANCE = {torch.float32: (1e-3, 1e-4), torch.float16: (0.05, 0.01), torch.bfloat16: (0.15, 0.03)}
# dtype -> the log-probability tolerance's part relative to the log-probability's size: a log-probability of -12
# (a flat distribution over 150k ids) carries a rounding error 12 times that of -1. bfloat16: 2**-5, four
# roundings of its 8-bit significand (a random Qwen2 7B on an H200 differed by 0.156 nats at log-probabilities
# near -12: 0.013 of their size)
RELATIVE = {torch.float32: 1e-5, torch.float16: 2.0 ** -8, torch.bfloat16: 2.0 ** -5}
SYNTHETIC = 24  # prompt length of the probe where no prompt is at hand (the request engine's lanes)
_SAID: set[str] = set()


class ProofFailed(RuntimeError):
    """The fast engine disagreed with the eager engine on this machine (or crashed while proving)."""


def enabled() -> bool:
    """Whether unproven pairs are proven (``HF_RSTITCH_PROVE`` not off)."""
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def unproven(llm, slm, batch: int, reason: str, config, kept):
    """What ``"auto"`` does with a pair :func:`.support.why_not_fast` refused for ``reason``, for the fast
    engine's ``config`` (``kept(llm, config)``: the fast engine kept on the LLM for it, made on first use):
    ``(reason, None)`` -- the eager engine (a refusal no probe lifts, ``HF_RSTITCH_PROVE=off``, or a stored failed
    proof, its reason added) -- or ``(None, chosen)``: the fast engine, ``chosen`` a :class:`Proving` builder that
    proves it on the first call, or ``config`` itself where a passed proof is stored."""
    if not enabled() or support.why_not_fast(llm, slm, batch, proven=False) is not None:
        return reason, None
    record = proof_store.load(proof_store.key_for(llm, slm, config, llm.device))
    if record is None:
        return None, Proving(config, kept)
    if record["passed"]:
        _say(f"hf_rstitch: stitch_engine='auto' runs the fast engine on this pair: proven on this machine "
             f"({record['date']}; rstitch env lists the proofs)")
        return None, config
    return f"{reason}; its proof on this machine failed ({record['reason']})", None


class Proving:
    """The lane builder of an unproven pair: the lanes of ``kept(llm, config)`` -- the fast engine kept on the LLM
    for ``config`` (``generate``'s; the fallback drops it by ``config``), or the request engine's own, freed with its
    :class:`~hf_rstitch.engine.Engine` -- which prove themselves on their first ``advance`` (the prompt's tokens), or
    once, at once, on a synthetic prompt where the caller asks for paged lanes (the request engine, which cannot
    rerun a request; later calls get the same lanes again)."""

    single_device = True

    def __init__(self, config, kept):
        self.config, self._kept, self._proved = config, kept, False

    def __repr__(self) -> str:
        return f"Proving({self.config!r})"

    def lanes(self, llm, slm, vocab, batch_size, capacity, timing=False, kv_tokens=None) -> dict:
        engine = self._kept(llm, self.config)
        if kv_tokens is not None:  # proven once, on the first set of lanes (later calls get them again, reset)
            built = engine.lanes(llm, slm, vocab, batch_size, capacity, timing, kv_tokens)
            if not self._proved:
                ids = torch.arange(SYNTHETIC, device=llm.device).remainder(vocab).repeat(batch_size, 1)
                _settle(llm, slm, self.config, built, ids, torch.ones_like(ids))
                self._proved = True
            return built
        built = engine.lanes(llm, slm, vocab, batch_size, capacity, timing)
        state = _Pending(llm, slm, self.config, built)
        return {role: _ProvingLane(lane, state) for role, lane in built.items()}


class _Pending:
    """The pair's probe, run once, by whichever lane is advanced first."""

    def __init__(self, llm, slm, config, lanes):
        self.llm, self.slm, self.config, self.lanes, self.done = llm, slm, config, lanes, False

    def run(self, seq: torch.Tensor, mask: torch.Tensor) -> None:
        if not self.done:
            self.done = True
            _settle(self.llm, self.slm, self.config, self.lanes, seq, mask)


class _ProvingLane:
    """A fast lane whose first ``advance`` runs the pair's probe (then resets both lanes); otherwise the lane."""

    def __init__(self, lane, state: _Pending):
        self.__dict__.update(_lane=lane, _state=state)

    def advance(self, seq, mask, *args, **kwargs):
        self._state.run(seq, mask)
        return self._lane.advance(seq, mask, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._lane, name)

    def __setattr__(self, name, value):
        setattr(self._lane, name, value)


def _settle(llm, slm, config, lanes, seq, mask) -> None:
    """Probe, store the verdict, reset the lanes; raise :class:`ProofFailed` where it failed or crashed."""
    key = proof_store.key_for(llm, slm, config, llm.device)
    start = time.perf_counter()
    try:
        metrics = probe(lanes, {Role.LLM: llm, Role.SLM: slm}, seq, mask)
        reason = failure(metrics, llm.dtype)
    except Exception as err:  # noqa: BLE001 - a crash while proving is a failed proof, its reason kept
        metrics, reason = {}, f"crashed: {type(err).__name__}: {str(err).strip()[:200]}"
    finally:
        for lane in lanes.values():
            lane.reset()
    seconds = time.perf_counter() - start
    proof_store.save(key, reason is None, reason, metrics, seconds)
    if reason is not None:
        raise ProofFailed(f"the fast engine's proof on this machine failed: {reason} "
                          "(stored; rstitch env lists it, HF_RSTITCH_PROVE=off skips proofs)")
    _say(f"hf_rstitch: the fast engine proved equal to the eager engine on this machine in {seconds:.2f} s "
         f"(stored: later calls skip the probe)")


def probe(fast_lanes: dict, models: dict, seq: torch.Tensor, mask: torch.Tensor) -> dict:
    """Teacher-force both engines over ``seq`` ``[B, T]`` (``mask`` its attention mask): a prefill of all but the
    last :data:`STEPS` tokens (at least every row's left padding and one token), then one token at a time; per role the largest differences seen
    (``{"slm": {"logprob", "entropy", "argmax_flips", "near_ties", "steps"}, "llm": ...}``)."""
    width = seq.shape[1]
    padding = int((mask.cumsum(1) == 0).sum(1).max())  # a lane learns each row's left padding from its first call
    first = max(1, width - STEPS, min(padding + 1, width))
    rows = torch.ones(seq.shape[0], dtype=torch.bool)
    resumed = torch.zeros_like(rows)
    metrics = {}
    for role, fast in fast_lanes.items():
        eager = Lane(models[role], role, fast.vocab, seq.shape[0])
        fast.reset()
        tol = TOLERANCE.get(models[role].dtype, TOLERANCE[torch.float32])[0]
        rel = RELATIVE.get(models[role].dtype, RELATIVE[torch.float32])
        seen = {"logprob": 0.0, "entropy": 0.0, "argmax_flips": 0, "near_ties": 0, "steps": 0}
        with torch.no_grad():
            for end in range(first, width + 1):
                mine, _, _ = fast.advance(seq[:, :end], mask[:, :end], rows, resumed)
                mine_h = fast.entropy(mine)
                theirs, _, _ = eager.advance(seq[:, :end], mask[:, :end], rows, resumed)
                _compare(mine.float(), mine_h, theirs.float(), eager.entropy(theirs), tol, rel, seen)
        metrics[str(role)] = seen
    return metrics


def _compare(fast, fast_h, eager, eager_h, tol: float, rel: float, seen: dict) -> None:
    """Fold one step's differences (logits ``[B, V]``, entropies ``[B]``) into ``seen``: ``logprob`` is the
    largest difference of a top log-probability beyond ``rel`` times its size (what the absolute tolerance
    bounds), ``logprob_raw`` the largest difference itself."""
    lp_fast, lp_eager = torch.log_softmax(fast, -1), torch.log_softmax(eager, -1)
    top = lp_eager.topk(min(TOP, lp_eager.shape[-1]), dim=-1)
    gap = (top.values[:, 0] - top.values[:, 1]) if top.values.shape[-1] > 1 else torch.full_like(top.values[:, 0], 1e9)
    flips = (lp_fast.argmax(-1) != top.indices[:, 0]) & (gap > tol)
    diff = (lp_fast.gather(-1, top.indices) - top.values).abs()
    seen["logprob"] = max(seen["logprob"], (diff - rel * top.values.abs()).max().item())
    seen["logprob_raw"] = max(seen.get("logprob_raw", 0.0), diff.max().item())
    seen["entropy"] = max(seen["entropy"], (fast_h.float().cpu() - eager_h.float().cpu()).abs().max().item())
    seen["argmax_flips"] += int(flips.sum().item())
    seen["near_ties"] += int((gap <= tol).sum().item())
    seen["steps"] += 1


def failure(metrics: dict, dtype: torch.dtype) -> str | None:
    """Why ``metrics`` (:func:`probe`'s) fail the dtype's tolerances; None when they pass."""
    tol_lp, tol_h = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    for role, seen in metrics.items():
        if not seen["logprob"] <= tol_lp:  # NaN fails too
            rel = RELATIVE.get(dtype, RELATIVE[torch.float32])
            return (f"{role} log-probabilities differ by {seen['logprob']:.3g} nats beyond {rel:g} of their size "
                    f"(tolerance {tol_lp:g} for {dtype})")
        if not seen["entropy"] <= tol_h:
            return f"{role} entropies differ by {seen['entropy']:.3g} (tolerance {tol_h:g} for {dtype})"
        if seen["argmax_flips"]:
            return f"{role} most likely token differs at {seen['argmax_flips']} step(s) away from near-ties"
    return None


def _say(message: str) -> None:
    log.log(logging.DEBUG if message in _SAID else logging.INFO, message)
    _SAID.add(message)
