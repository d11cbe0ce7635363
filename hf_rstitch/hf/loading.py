"""Loading a model pair: the one loader behind ``rstitch eval``, ``tune``, ``generate``, ``env --plan``, the
router's training and :func:`hf_rstitch.toyworld.load_pair`.

An LLM and an SLM from two checkpoints (local folders or Hub ids; ``shipped:llm`` / ``shipped:slm`` once
resolved), in one dtype, on one device, in eval mode, with the LLM's tokenizer. The two tokenizers must share
a vocabulary: stitching passes token ids between the models.
"""

from __future__ import annotations

from typing import Any


def resolve_device(device: str) -> str:
    """``"auto"``: ``"cuda"`` if available, else ``"cpu"``; any other name as given."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """``"auto"``: bfloat16 on CUDA, float32 elsewhere; else the torch dtype of that name (``"float16"``, ...)."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def load_pair(llm: str, slm: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, Any]:
    """``(llm, slm, tokenizer)`` from two checkpoints (local folders or Hub ids) in ``dtype`` (a name, or
    ``"auto"``: :func:`resolve_dtype`) on ``device``, in eval mode. Raises ``ValueError`` when the two
    tokenizers differ and ``OSError`` (at once, not after minutes of retries) for a Hub id that cannot load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..sources import check_hub_source

    check_hub_source(llm, "--llm")
    check_hub_source(slm, "--slm")
    tok = AutoTokenizer.from_pretrained(llm)
    if tok.get_vocab() != AutoTokenizer.from_pretrained(slm).get_vocab():
        raise ValueError(
            f"the LLM ({llm}) and SLM ({slm}) tokenizers differ; stitching and speculative decoding "
            "pass token ids between the models, so pick a pair from one tokenizer family."
        )
    torch_dtype = resolve_dtype(dtype, device)
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype).to(device).eval() for p in (llm, slm)]
    return models[0], models[1], tok
