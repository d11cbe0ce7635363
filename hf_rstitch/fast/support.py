"""Which pairs ``stitch_engine="auto"`` runs on the fast engine: the one home of that decision's facts.

``"auto"`` must never turn a ``generate`` that works on the eager engine into a crash or other tokens,
so it runs the fast engine only on what has been proven:

* architectures (``config.model_type``) in :data:`PROVEN`: fast and equal to the eager engine token for
  token in the zoo suite (``tests/zoo``: every causal LM transformers ships, tiny random float32 pairs,
  the static-cache path on the CPU) *and* in the GPU zoo run of ``"auto"`` (``benchmarks/zoo.py`` ->
  ``benchmarks/results/zoo_*.json``, CUDA graphs and ``compile="parts"``); a test checks this set
  against the latest result file;
* GPUs of the compute capabilities in :data:`PROVEN_CAPABILITIES` (where those runs were made);
* pairs that have not failed on the fast engine in this process (:func:`remember_failure`: a failure
  while building lanes, capturing or compiling falls back to the eager engine, and later calls of that
  pair go there directly).

A pair refused only for being outside the proven lists (an architecture or a GPU) is proven on the user's machine
instead, on its first call (:mod:`.proof`; ``why_not_fast(..., proven=False)`` gives the refusals no proof lifts).
Anything else runs the eager engine, the reason logged once (:func:`why_not_fast` says it).
``stitch_engine="fast"`` by name skips the proven lists: it tries any model the lanes can hold
(:func:`~hf_rstitch.fast.config.check_supported`), and fails loudly where they cannot.
"""

from __future__ import annotations

import weakref

import torch
from transformers import PreTrainedModel

from ..core.devices import describe, is_sharded
from ..core.roles import Role
from .config import check_supported

# fast == eager token for token in tests/zoo (CPU, float32) and under "auto" (or by name, with auto's configuration)
# on an H100 (9.0, torch 2.11, transformers 5.17; benchmarks/zoo.py, B = 1 and 3): extend it from a newer
# benchmarks/results/zoo_<gpu>.json, whose `fast_by_name` rows say what the fast engine proves there (a composite
# model's text model_type too, as emu3's emu3_text_model: auto looks its text config up)
PROVEN = frozenset({
    "afmoe", "apertus", "arcee", "bert", "bert-generation", "biogpt", "bitnet", "camembert", "cohere2", "cohere2_moe",
    "ctrl", "cwm", "data2vec-text", "diffllama", "dots1", "electra", "emu3", "emu3_text_model", "ernie", "ernie4_5",
    "ernie4_5_moe", "exaone4", "exaone_moe", "flex_olmo", "fuyu", "gemma", "gemma2", "gemma3", "gemma3_text",
    "gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "glm", "glm4", "glm4_moe", "got_ocr2",
    "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neox", "gpt_oss", "granite", "granite_swa", "granitemoe", "granitemoe_swa",
    "granitemoeshared", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hyperclovax", "jais2", "lfm2",
    "llama", "mellum", "minimax_m2", "minimax_m3_vl_text", "ministral", "ministral3", "mistral", "mixtral",
    "modernbert-decoder", "nanochat", "nemotron", "olmo", "olmo2", "olmo3", "olmoe", "opt", "persimmon", "phi",
    "phi3", "phi4_multimodal", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "roberta",
    "roberta-prelayernorm", "roc_bert", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2", "vaultgemma",
    "xlm-roberta", "xlm-roberta-xl"
})
PROVEN_CAPABILITIES = frozenset({(9, 0)})  # H100 / H200: where every fast-engine result so far was measured
FAILED = "_rstitch_fast_failed"  # on the LLM: WeakKeyDictionary {slm: reason} of pairs that failed fast


def why_not_fast(llm: PreTrainedModel, slm: PreTrainedModel, batch: int = 1, proven: bool = True) -> str | None:
    """Why ``stitch_engine="auto"`` runs this pair on the eager engine, in one line; None: the fast engine.
    ``proven=False``: only the refusals no proof on this machine can lift (:mod:`.proof`), not the proven lists."""
    failed = failure(llm, slm)
    if failed is not None:
        return f"this pair failed on the fast engine earlier in this process ({failed})"
    for model, role in ((llm, Role.LLM), (slm, Role.SLM)):
        reason = model_refusal(model, batch, proven)
        if reason is not None:
            return f"the {role}{reason}"
    return None


def model_refusal(model: PreTrainedModel, batch: int = 1, proven: bool = True) -> str | None:
    """Why one model of a pair does not run on the fast engine under ``"auto"`` (``": ..."`` or ``" is ..."``,
    to follow its role); None when it does. ``proven=False``: the proven lists are not asked."""
    try:
        check_supported(model, batch)
    except ValueError as err:
        return f": {err}"
    kind = getattr(model.config.get_text_config(), "model_type", None) or model.config.model_type
    if proven and kind not in PROVEN and model.config.model_type not in PROVEN:
        return (f" is of architecture {kind!r}, which the fast engine has not been proven equal on (proven: "
                "hf_rstitch.fast.support.PROVEN, docs/models.md); stitch_engine='fast' tries it anyway")
    if is_sharded(model):
        return f" is {describe(model)}; the fast engine runs single-device models only"
    if getattr(model, "hf_quantizer", None) is not None:
        return " is quantized; the fast engine is tested on unquantized weights only"
    if model.device.type != "cuda":
        return f" is on {model.device}; the fast engine's graphs need CUDA"
    capability = torch.cuda.get_device_capability(model.device)
    if proven and capability not in PROVEN_CAPABILITIES:
        return (f" is on {torch.cuda.get_device_name(model.device)} (compute capability "
                f"{capability[0]}.{capability[1]}), where the fast engine has not been proven (proven: "
                f"{', '.join(f'{a}.{b}' for a, b in sorted(PROVEN_CAPABILITIES))}); stitch_engine='fast' tries it")
    return None


def remember_failure(llm: PreTrainedModel, slm: PreTrainedModel, reason: str) -> None:
    """Note that this pair failed on the fast engine: later ``"auto"`` calls run it on the eager engine."""
    llm.__dict__.setdefault(FAILED, weakref.WeakKeyDictionary())[slm] = reason


def failure(llm: PreTrainedModel, slm: PreTrainedModel) -> str | None:
    """The reason this pair failed on the fast engine in this process, or None."""
    failed = llm.__dict__.get(FAILED)
    return None if failed is None else failed.get(slm)
