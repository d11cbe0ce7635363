"""``stitched_decode``: the ``custom_generate`` callable that runs R-Stitch inside ``generate``.

transformers prepares everything (generation config, logits processors with the sampling
warpers, stopping criteria with EOS / max length) and then calls this function with the
LLM as ``model``. It builds one lane per model, resolves the routing policy and runs
:func:`hf_rstitch.decode.stitch_loop`.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..core.policies import EntropyPolicy, RoutingPolicy, checked
from ..core.sampling import pad_vocab
from ..decode.loop import stitch_loop
from ..decode.engines import resolve_engine
from .checks import check_pair, check_request, shared_width, streamer_from_generate
from .fallback import run_with_fallback
from .placement import check_placement
from .output import StitchedGenerateOutput


def logit_width(model: PreTrainedModel) -> int:
    """Number of logits the model emits (its embedding rows, which may exceed the tokenizer)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


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
            reruns on the eager engine, the reason logged once (:mod:`hf_rstitch.hf.fallback`).

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
    """The body of :func:`stitched_decode` once the streamer is known: checks, lanes, the loop, the output."""
    slm = check_pair(model, stitch_slm)
    policy = resolve_policy(stitch_threshold, stitch_policy, generation_config, stitch_router, slm)
    vocab = shared_width(logit_width(model), logit_width(slm))  # ids either model may emit (a cut is logged)
    check_request(input_ids, generation_config, model_kwargs, vocab)
    engine, auto = resolve_engine(model, slm, stitch_engine, input_ids.shape[0], fast=_fast_engine)
    check_placement(model, slm, input_ids, do_sample=bool(generation_config.do_sample), engine=engine)
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask

    def attempt(engine, skip: int, streamed: list[int]):
        """The call on ``engine``; the first ``skip`` steps are not streamed (a rerun's), ``streamed[0]`` counts."""
        def on_token(tok):
            streamed[0] += 1
            if streamed[0] > skip:
                stitch_streamer.put(tok.cpu())

        lanes = engine.lanes(model, slm, vocab, input_ids.shape[0], generation_config.max_length, timing=stitch_timing)
        return stitch_loop(
            lanes,
            input_ids,
            mask,
            policy,
            process=logits_processor if logits_processor else None,  # none: the lanes may pick greedy tokens
            should_stop=quick_stopping(stopping_criteria) or stopping_criteria,
            do_sample=bool(generation_config.do_sample),
            pad_token_id=pad_id(generation_config),
            on_token=on_token if stitch_streamer is not None else None,
            keep_scores=bool(generation_config.output_scores),
            keep_logits=bool(generation_config.output_logits),
            drop_finished=finished_rows_unseen(generation_config, logits_processor, stopping_criteria),
        )

    # auto: a fast-engine failure reruns eagerly
    result = run_with_fallback(model, slm, engine, attempt) if auto else attempt(engine, 0, [0])
    for trace in result.traces:
        trace.threshold = getattr(policy, "threshold", None)
    return to_output(result, model, generation_config)


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


def _fast_engine(llm, slm, spec, batch: int, own: bool):
    """:func:`hf_rstitch.fast.fast_engine`, imported when a call asks for the fast engine (or ``"auto"``)."""
    from ..fast import fast_engine

    return fast_engine(llm, slm, spec, batch, own)


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
