"""Which modules of a model rotate and normalize q and k: the modelling modules whose ``apply_rotary_pos_emb`` the
fast engine may replace (:func:`rotary_functions`), and the per-head q/k norms the rotation kernel may apply
(:func:`norm_plan`). Model introspection only: the kernels are :mod:`.rope_store`'s.
"""

from __future__ import annotations

import sys

import torch


def rotary_functions(model: torch.nn.Module) -> list:
    """``(modelling module, its apply_rotary_pos_emb)`` for each module defining ``model``'s attention layers."""
    found, seen = [], set()
    for m in model.modules():
        module = sys.modules.get(type(m).__module__)
        fn = getattr(module, "apply_rotary_pos_emb", None)
        if type(m).__name__.endswith("Attention") and callable(fn) and module not in seen:
            seen.add(module)
            found.append((module, fn))
    return found


def norm_plan(model: torch.nn.Module) -> list:
    """The per-head q/k norm modules (``q_norm`` / ``k_norm`` of an attention layer, Qwen3's) that the rotation
    kernel may apply: both computing Llama's RMSNorm (the probe of :func:`hf_rstitch.fast.kernels.norms.llama_rms_norm`),
    of the head size, one epsilon. A lane checks the model reads their outputs only through the rotation
    (:func:`~.rope_store.defers_exactly`)."""
    from .norms import llama_rms_norm

    found = []
    for m in model.modules():
        qn, kn = getattr(m, "q_norm", None), getattr(m, "k_norm", None)
        if (type(m).__name__.endswith("Attention") and llama_rms_norm(qn) and llama_rms_norm(kn)
                and qn.weight.shape == kn.weight.shape and qn.variance_epsilon == kn.variance_epsilon):
            found += [qn, kn]
    return found
