"""``Pair``: the two models of stitched decoding, checked to work together, and what the engine reads off them.

:meth:`Pair.of` refuses what cannot be stitched (no SLM, not a causal LM, an encoder-decoder, special token ids
that differ), each error naming the fix; the pair then carries the vocabulary both models may emit, the end and
pad ids, its device and context window, which the engine (:func:`~hf_rstitch.engine.build`), ``generate`` and
the request engine read from here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from transformers import PreTrainedModel

DEFAULT_CONTEXT = 32768  # longest request of a model whose config names no context window


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


def logit_width(model: PreTrainedModel) -> int:
    """Number of logits the model emits (its embedding rows, which may exceed the tokenizer)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


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


@dataclass(frozen=True, eq=False)
class Pair:
    """Two models that stitch: ``llm`` and ``slm`` (one tokenizer), as :meth:`of` checked them.

    Attributes:
        vocab: ids either model may emit (the narrower logit width; a cut is logged once: :func:`shared_width`).
        eos: the LLM's end ids (``generation_config.eos_token_id``), a frozenset.
        pad_id: what rows that finished are padded with: the LLM's pad id, else its smallest end id, else 0.
    """

    llm: PreTrainedModel
    slm: PreTrainedModel
    vocab: int
    eos: frozenset
    pad_id: int

    @classmethod
    def of(cls, llm: PreTrainedModel, slm: PreTrainedModel | None) -> "Pair":
        slm = check_pair(llm, slm)
        eos = llm.generation_config.eos_token_id
        eos = frozenset([eos] if isinstance(eos, int) else (eos or []))
        pad = llm.generation_config.pad_token_id
        return cls(llm, slm, shared_width(logit_width(llm), logit_width(slm)), eos,
                   int(pad if pad is not None else min(eos, default=0)))

    @property
    def device(self):
        """Where token ids go: the LLM's (input embeddings') device."""
        return self.llm.device

    @property
    def context(self) -> int:
        """The LLM's context window (``max_position_embeddings``; :data:`DEFAULT_CONTEXT` where it names none)."""
        return getattr(self.llm.config.get_text_config(), "max_position_embeddings", None) or DEFAULT_CONTEXT
