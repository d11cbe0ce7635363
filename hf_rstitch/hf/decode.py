"""``stitched_decode``: the ``custom_generate`` callable that runs R-Stitch inside ``generate``.

transformers prepares everything (generation config, logits processors with the sampling
warpers, stopping criteria with EOS / max length) and then calls this function with the
LLM as ``model``. It builds the pair's engine once (:func:`hf_rstitch.engine.build`), resolves the routing
policy and runs :func:`hf_rstitch.decode.stitch_loop` on that engine.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..core.policies import EntropyPolicy, RoutingPolicy, checked
from ..core.sampling import pad_vocab
from ..decode.loop import stitch_loop
from ..engine.engine import Engine, build, restore_rng, rng_state
from ..engine.config import EngineConfig
from ..engine.pair import Pair, logit_width
from .checks import check_request, streamer_from_generate
from .placement import check_placement
from .output import StitchedGenerateOutput


def pad_id(config: GenerationConfig) -> int:
    """What generate appends to rows that finished early: pad, else the (first) EOS id, else 0."""
    for value in (config.pad_token_id, config.eos_token_id):
        if value is not None:
            return int(value[0] if isinstance(value, (list, tuple)) else value)
    return 0


def resolve_policy(
    stitch_threshold: float | None, stitch_policy: RoutingPolicy | None, config: GenerationConfig,
    stitch_router=None, slm: PreTrainedModel | None = None,
) -> RoutingPolicy:
    """An explicit policy wins; then a router (R-Stitch+); else the threshold (argument, then
    generation config)."""
    if stitch_policy is None and stitch_router is not None:
        from ..router.policy import policy_from_router

        stitch_policy = policy_from_router(stitch_router, slm, stitch_threshold)
    if stitch_policy is not None:
        if not isinstance(stitch_policy, RoutingPolicy):
            raise TypeError(
                f"`stitch_policy` must implement hand_to_llm / hand_to_slm / reset / needs_hidden "
                f"(see hf_rstitch.core.policies), got {type(stitch_policy).__name__}."
            )
        return checked(stitch_policy)  # a foreign policy's decisions are checked: [B] bool
    if stitch_threshold is None:
        stitch_threshold = getattr(config, "stitch_threshold", None)
    if stitch_threshold is None:
        raise ValueError(
            "stitched decoding needs `stitch_threshold` (a normalized entropy in [0, 1], e.g. 0.02) or a "
            "`stitch_policy`; pass it to generate() or set generation_config.stitch_threshold."
        )
    return EntropyPolicy(stitch_threshold)


def stitched_decode(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    stitch_slm: PreTrainedModel | None = None,
    stitch_threshold: float | None = None,
    stitch_policy: RoutingPolicy | None = None,
    stitch_router=None,
    stitch_streamer=None,
    stitch_timing: bool = False,
    stitch_engine=None,
    **model_kwargs,
) -> StitchedGenerateOutput | torch.LongTensor:
    """R-Stitch decoding with ``model`` as the LLM and ``stitch_slm`` as the SLM.

    Use it through ``generate`` after ``import hf_rstitch`` (``assistant_model=slm,
    stitch_threshold=tau``), or without the patch as
    ``llm.generate(..., custom_generate=hf_rstitch.stitched_decode, stitch_slm=slm, stitch_threshold=tau)``
    (transformers does not forward ``assistant_model`` to callables; pass ``stitch_slm``;
    generate's ``streamer=`` is picked up from the calling ``generate``).

    Args:
        stitch_slm: the small model; shares the LLM's tokenizer.
        stitch_threshold: tau, normalized-entropy threshold in [0, 1].
        stitch_policy: any :class:`~hf_rstitch.core.policies.RoutingPolicy`; overrides the threshold.
        stitch_router: R-Stitch+ router (object, local folder or Hub id); consulted on SLM steps above
            ``stitch_threshold`` (default: the threshold it was trained with). See :mod:`hf_rstitch.router`.
        stitch_streamer: receives every new token (``put``) and ``end()``.
        stitch_timing: record device-synchronised seconds of every forward call in the trace.
        stitch_engine: ``None`` (the default): ``"auto"``, or the engine ``$HF_RSTITCH_ENGINE`` names.
            ``"auto"``: the fast engine (static caches, CUDA graphs, ``FastConfig(compile="parts")``) where
            it can run the pair (both models on CUDA, one device each, full attention), kept on the LLM
            for later calls (:func:`hf_rstitch.fast.release` frees it); the eager lanes otherwise, the
            reason logged at INFO on ``hf_rstitch.fast``. ``"default"``: the eager lanes (any device, any
            model). ``"fast"``, a :class:`hf_rstitch.fast.FastConfig` or a reusable
            :class:`hf_rstitch.fast.FastEngine`: the fast engine, an error where it cannot run. Where
            ``"auto"`` picked the fast engine and it fails (building lanes, capturing, compiling), the call
            reruns on the eager engine, the reason logged once (:func:`run_once_more`). Which engine runs and
            how it is built: :mod:`hf_rstitch.engine`.

    Returns:
        The sequences ``[B, T]``, or with ``return_dict_in_generate=True`` a
        :class:`StitchedGenerateOutput` whose ``stitch`` holds the trace (a list of traces,
        one per row, when B > 1).
    """
    stitch_streamer = stitch_streamer if stitch_streamer is not None else streamer_from_generate()
    try:
        return _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, stitch_slm,
                       stitch_threshold, stitch_policy, stitch_router, stitch_streamer, stitch_timing, stitch_engine,
                       model_kwargs)
    finally:  # generate already put the prompt into the streamer: its consumer waits for end(), even on errors
        if stitch_streamer is not None:
            stitch_streamer.end()


def _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, stitch_slm, stitch_threshold,
            stitch_policy, stitch_router, stitch_streamer, stitch_timing, stitch_engine, model_kwargs):
    """The body of :func:`stitched_decode` once the streamer is known: checks, the engine, the loop, the output."""
    pair = Pair.of(model, stitch_slm)
    policy = resolve_policy(stitch_threshold, stitch_policy, generation_config, stitch_router, pair.slm)
    check_request(input_ids, generation_config, model_kwargs, pair.vocab)
    check_placement(model, pair.slm, input_ids, do_sample=bool(generation_config.do_sample), engine=stitch_engine)
    engine = build(pair, EngineConfig.of(stitch_engine, max_batch=input_ids.shape[0], shared=True,
                                         max_length=generation_config.max_length, timing=stitch_timing))
    mask = model_kwargs.get("attention_mask")
    run = _Run(input_ids, torch.ones_like(input_ids) if mask is None else mask, policy, logits_processor,
               stopping_criteria, generation_config, stitch_streamer)
    result = run_once_more(engine, run)
    for trace in result.traces:
        trace.threshold = getattr(policy, "threshold", None)
    return to_output(result, model, generation_config)


def run_once_more(engine: Engine, run: "_Run"):
    """``run`` on ``engine``; where ``"auto"`` picked the fast engine and it fails, once more on the eager engine
    that :meth:`~hf_rstitch.engine.Engine.fall_back` gives, from the RNG state the call started with (sampled tokens
    are drawn as they would have been had the eager engine run from the start). Steps already streamed are not
    streamed again; where the fast run streamed tokens that the eager engine then draws differently (possible in
    bfloat16, never in float32, where the zoo suite proves the engines equal), the returned sequences are the eager
    engine's. A named engine's errors are raised."""
    state = rng_state(engine.pair.device) if engine.may_fall_back else None
    try:
        return run(engine)
    except Exception as err:  # noqa: BLE001  (any failure of the fast path: fall_back decides)
        eager = engine.fall_back(err)
        restore_rng(state)
        return run(eager, skip=run.streamed)


class _Run:
    """One ``generate`` call's loop over an engine (:func:`stitch_loop`), streaming each step once."""

    def __init__(self, input_ids, mask, policy, processors, criteria, config: GenerationConfig, streamer):
        self.input_ids, self.mask, self.policy, self.streamer = input_ids, mask, policy, streamer
        self.processors, self.criteria, self.config = processors, criteria, config
        self.streamed = 0  # steps streamed so far (a rerun's first ones are not put again)

    def __call__(self, engine: Engine, skip: int = 0):
        config, count = self.config, [0]

        def on_token(tok):
            count[0] += 1
            if count[0] > skip:
                self.streamer.put(tok.cpu())
            self.streamed = max(self.streamed, count[0])

        return stitch_loop(
            engine,
            self.input_ids,
            self.mask,
            self.policy,
            process=self.processors if self.processors else None,  # none: the lanes may pick greedy tokens
            should_stop=quick_stopping(self.criteria) or self.criteria,
            do_sample=bool(config.do_sample),
            pad_token_id=pad_id(config),
            on_token=on_token if self.streamer is not None else None,
            keep_scores=bool(config.output_scores),
            keep_logits=bool(config.output_logits),
            drop_finished=finished_rows_unseen(config, self.processors, self.criteria),
            guess=pure_callbacks(self.processors, self.criteria),
        )


# transformers' processors whose calls change their own state (a model's cache, rows seen so far): a second call
# for the same step would not answer as the first
STATEFUL = frozenset({"UnbatchedClassifierFreeGuidanceLogitsProcessor", "DiaEOSDelayPatternLogitsProcessor",
                      "WhisperNoSpeechDetection"})


def pure_callbacks(processors, criteria) -> bool:
    """Whether the loop may call the processors and stopping criteria again for a step it guessed and undid
    (:func:`hf_rstitch.decode.stitch_loop`'s ``guess``): transformers' own, which answer from their inputs alone,
    but for :data:`STATEFUL`. A processor or criterion from elsewhere is not known to be pure: the loop then reads
    every routing decision before it queues the next step."""
    kinds = [type(c) for c in [*(processors or []), *(criteria or [])]]
    return all(k.__module__.startswith("transformers.") and k.__name__ not in STATEFUL for k in kinds)


def finished_rows_unseen(config: GenerationConfig, processors, criteria) -> bool:
    """Whether finished rows can leave the models without anything observable changing.

    Plain ``generate`` runs finished rows to the end; their logits reach the processors and,
    through them, ``scores`` / ``logits`` and the stopping criteria. transformers' own processors
    and criteria work row by row, and a finished row's token is the pad token whatever its
    scores, so with those alone and no scores or logits returned, nobody sees the difference.
    """
    if config.output_scores or config.output_logits:
        return False
    return all(type(c).__module__.startswith("transformers.") for c in [*(processors or []), *(criteria or [])])


def quick_stopping(criteria):
    """``criteria`` as one stopper with the same answers and at most one tensor operation a step, when they are
    only transformers' :class:`MaxLengthCriteria` and :class:`EosTokenCriteria` (what ``generate`` builds from
    ``max_length`` / ``max_new_tokens`` and ``eos_token_id``); else None (the loop calls ``criteria``).

    The list would launch half a dozen small kernels a step (two fills, two ors, ``isin``, ``any``): host
    time a small model's step notices. Here the length is read on the host and only the EOS check runs."""
    kinds = [type(c) for c in criteria or []]
    if not kinds or any(k not in (MaxLengthCriteria, EosTokenCriteria) for k in kinds):
        return None
    lengths = [c for c in criteria if type(c) is MaxLengthCriteria]
    eos = [c.eos_token_id for c in criteria if type(c) is EosTokenCriteria]
    max_length = min((c.max_length for c in lengths), default=None)
    position_limit = min((c.max_position_embeddings or max_length for c in lengths), default=None)
    ids = torch.cat([torch.as_tensor(e).flatten() for e in eos]) if eos else None
    answers = {}  # (rows, device, done) -> the constant [B] bool answer, read only by the loop

    def constant(seq: torch.Tensor, done: bool) -> torch.Tensor:
        key = (seq.shape[0], seq.device, done)
        if key not in answers:
            answers[key] = torch.full((seq.shape[0],), done, dtype=torch.bool, device=seq.device)
        return answers[key]

    def stop(seq: torch.Tensor, scores) -> torch.Tensor:
        nonlocal ids
        width = seq.shape[1]
        if max_length is not None and width >= max_length:
            return constant(seq, True)
        if position_limit is not None and width > position_limit:  # transformers' warning, once
            return criteria(seq, scores)
        if ids is None:
            return constant(seq, False)
        if ids.device != seq.device:
            ids = ids.to(seq.device, non_blocking=True)  # once; from the closure's tensor, which stays
        return torch.isin(seq[:, -1], ids)

    return stop


def to_output(result, llm: PreTrainedModel, config: GenerationConfig) -> StitchedGenerateOutput | torch.LongTensor:
    """What plain generate would return, plus the trace(s); scores padded to the LLM's width."""
    if not config.return_dict_in_generate:
        return result.sequences
    width = logit_width(llm)
    return StitchedGenerateOutput(
        sequences=result.sequences,
        scores=tuple(pad_vocab(s, width) for s in result.scores) if config.output_scores else None,
        logits=tuple(pad_vocab(s, width) for s in result.logits) if config.output_logits else None,
        stitch=result.traces[0] if len(result.traces) == 1 else result.traces,
    )
