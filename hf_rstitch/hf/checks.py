"""Input checks for stitched generation. Each error names the argument and the fix."""

from __future__ import annotations

import logging
import sys

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel


def _special_ids(model: PreTrainedModel) -> dict[str, object]:
    ids = {}
    for source in (model.generation_config, model.config.get_text_config()):  # generate reads the former first
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            value = getattr(source, name, None)
            if value is not None and name not in ids:
                ids[name] = sorted(value) if isinstance(value, (list, tuple)) else [value]
    return ids


def check_pair(llm: PreTrainedModel, slm: PreTrainedModel | None) -> PreTrainedModel:
    """The SLM exists, is a causal LM, and shares the LLM's special token ids."""
    if slm is None:
        raise ValueError(
            "`stitch_threshold` (or `stitch_policy`) was given without a small model. Pass it as "
            "`assistant_model=slm` to `generate` (or `stitch_slm=slm` with custom_generate=hf_rstitch.stitched_decode)."
        )
    if not isinstance(slm, PreTrainedModel) or not hasattr(slm, "get_output_embeddings"):
        raise TypeError(f"`assistant_model` must be a transformers causal LM, got {type(slm).__name__}.")
    if slm.config.is_encoder_decoder or llm.config.is_encoder_decoder:
        raise ValueError("stitched decoding supports decoder-only models only; got an encoder-decoder model.")
    a, b = _special_ids(llm), _special_ids(slm)
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            raise ValueError(
                f"the models' tokenizers look incompatible: `{name}` is {a[name]} for the LLM but {b[name]} for the "
                "assistant_model. R-Stitch needs one shared tokenizer; use models of the same family, or set both "
                f"models' generation_config.{name} to the same ids if their tokenizers really are identical."
            )
    return slm


_WIDTHS_SAID: set[tuple[int, int]] = set()  # (llm, slm) logit widths already logged in this process


def shared_width(llm_width: int, slm_width: int) -> int:
    """The logits both models emit: the narrower width. When the widths differ, says once (per pair of widths)
    what is cut and why: the wider model's extra ids (embedding rows padded past the tokenizer, as Qwen's 7B and
    1.5B differ) can never be stitched, since the other model cannot read or score them."""
    width = min(llm_width, slm_width)
    if llm_width != slm_width and (llm_width, slm_width) not in _WIDTHS_SAID:
        _WIDTHS_SAID.add((llm_width, slm_width))
        wider = "LLM" if llm_width > slm_width else "SLM"
        logging.getLogger(__name__).warning(
            "the LLM emits %d logits and the SLM %d: stitching uses the %d ids both emit and cuts the %s's logits "
            "%d..%d (ids the other model cannot read; usually embedding rows padded past the tokenizer, never "
            "written by it)", llm_width, slm_width, width, wider, width, max(llm_width, slm_width) - 1)
    return width


def check_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """Refuse right padding: a stitched batch appends every row's tokens at the end, after its prompt."""
    if attention_mask is None or attention_mask.ndim != 2 or input_ids.shape[0] < 2:
        return
    right = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
    if right:
        raise ValueError(
            f"`attention_mask` is right-padded (row {right[0]} ends in padding); stitched batches need left padding, "
            "every row's prompt ending at the last column: set tokenizer.padding_side = \"left\" before tokenizing.")


def check_tokenizers(tokenizer, assistant_tokenizer) -> None:
    """If both tokenizers are passed they must be the same vocabulary."""
    if tokenizer is None or assistant_tokenizer is None or tokenizer is assistant_tokenizer:
        return
    if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
        raise ValueError(
            "`tokenizer` and `assistant_tokenizer` differ; R-Stitch exchanges token ids, so both models must use the "
            "same tokenizer. Drop `assistant_tokenizer` if they are in fact the same, or pick a same-family pair."
        )


def check_request(input_ids: torch.Tensor, config: GenerationConfig, model_kwargs: dict, vocab: int | None = None) -> None:
    """Prompt shape and ids, decoding mode, options and cache type this version supports."""
    _check_prompt(input_ids, model_kwargs, vocab)
    check_padding(input_ids, model_kwargs.get("attention_mask"))
    _check_unsupported_options(config)
    if (config.num_beams or 1) > 1:
        raise ValueError("stitched decoding does not support beam search; set num_beams=1.")
    if (config.num_return_sequences or 1) > 1:
        raise ValueError("stitched decoding returns one sequence; set num_return_sequences=1 and call it repeatedly.")
    if config.cache_implementation not in (None, "dynamic"):
        raise ValueError(
            f"cache_implementation={config.cache_implementation!r} is not supported by stitched decoding; each model "
            "keeps its own DynamicCache. Remove `cache_implementation` (static caches come with the fast engine)."
        )
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))  # "cache" from transformers 5.24
    if cache is not None and (not isinstance(cache, DynamicCache) or cache.get_seq_length() > 0):
        raise ValueError(
            "stitched decoding builds one fresh DynamicCache per model; do not pass `cache` (`past_key_values` "
            "before transformers 5.24) "
            f"(got {type(cache).__name__} holding {cache.get_seq_length()} tokens)."
        )
    if config.output_attentions or config.output_hidden_states:
        raise ValueError(
            "output_attentions / output_hidden_states are not supported by stitched decoding (the two models differ "
            "in shape); use output_scores / output_logits, and out.stitch for provenance."
        )


def _check_prompt(input_ids: torch.Tensor, model_kwargs: dict, vocab: int | None) -> None:
    """Token ids (no embeddings) of shape [batch, length], both non-empty, inside the shared vocabulary."""
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError(
            "stitched decoding does not take `inputs_embeds`: the two models embed tokens differently, so each "
            "needs token ids. Pass `input_ids` (and `attention_mask`) instead."
        )
    if input_ids.ndim != 2 or input_ids.shape[0] == 0:
        raise ValueError(
            f"stitched decoding needs `input_ids` of shape [batch, length] with at least one row, got "
            f"{tuple(input_ids.shape)}. Pass one row per prompt (a 1-D tensor needs `[None]`)."
        )
    if input_ids.shape[1] == 0:
        raise ValueError(
            f"stitched decoding needs a non-empty prompt of shape [batch, length], got {tuple(input_ids.shape)}. "
            "Tokenize at least one token (e.g. the chat template's prefix)."
        )
    if vocab is not None:
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(
                f"`input_ids` holds id {high if high >= vocab else low}, outside the vocabulary both models share "
                f"(0..{vocab - 1}). Tokenize with the pair's shared tokenizer; if the LLM's vocabulary is larger "
                "than the SLM's, its extra ids cannot be stitched."
            )


def _check_unsupported_options(config: GenerationConfig) -> None:
    """Options of ``generate`` that stitching cannot honour: refused, each with what to do instead."""
    if getattr(config, "prompt_lookup_num_tokens", None) is not None:
        raise ValueError(
            "`prompt_lookup_num_tokens` (prompt-lookup decoding) cannot be combined with stitched decoding, which "
            "already decides per token which model writes it. Drop `prompt_lookup_num_tokens`, or drop the "
            "stitching arguments to use prompt lookup alone."
        )
    guidance = getattr(config, "guidance_scale", None)
    if guidance is not None and guidance != 1:
        raise ValueError(
            f"`guidance_scale={guidance}` (classifier-free guidance) is not supported by stitched decoding: it needs "
            "an unconditional forward of the writing model at every step, which neither lane runs. Drop "
            "`guidance_scale`, or generate with the LLM alone."
        )


def streamer_from_generate(depth: int = 2):
    """The ``streamer=`` of the transformers ``generate`` call that invoked the caller, or ``None``.

    transformers does not forward ``streamer`` to a ``custom_generate`` callable, yet it puts the
    prompt into it and leaves the rest to the callable: unless the callable finds it, the streamer
    never gets ``end()`` and its consumer (e.g. a ``TextIteratorStreamer`` loop) waits forever.
    ``depth`` counts frames from here to generate's body (2: generate -> stitched_decode -> this).
    """
    from transformers.generation import utils

    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    if frame.f_code.co_name != "generate" or frame.f_code.co_filename != utils.__file__:
        return None
    return frame.f_locals.get("streamer")
