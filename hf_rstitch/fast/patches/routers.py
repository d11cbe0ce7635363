"""Which MoE routers of a model run the router kernels (:mod:`hf_rstitch.fast.kernels.moe_router`), and the
forward they run.

A router runs them only where its ``forward`` is, to the letter, one of the two transformers ships for
top-k softmax routing (:func:`form`):

* Qwen3-MoE's (``Qwen3MoeTopKRouter``, and the routers copied from it): softmax, top-k, divided by the
  top-k sum where ``norm_topk_prob``, weights cast back to the logits' dtype;
* Mixtral's (``MixtralTopKRouter``, and its copies): softmax, top-k, always divided by the sum, weights left
  in float32.

Anything else (a bias, sigmoid or grouped scoring, jitter) keeps its code; so do float64 models and devices
where Triton does not run. The installed forward returns what the module returns: ``(logits, weights, ids)``.
"""

from __future__ import annotations

import functools

import torch

from ..source_text import source
from ..kernels import moe_router


@functools.lru_cache(maxsize=1)
def _forms() -> dict:
    """The reference routers' forward sources -> (renormalizes always, weights in float32)."""
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return {source(Qwen3MoeTopKRouter.forward): ("qwen3_moe", False),
            source(MixtralTopKRouter.forward): ("mixtral", True)}


def form(m: torch.nn.Module) -> str | None:
    """``"qwen3_moe"`` or ``"mixtral"``: the router form ``m``'s forward is to the letter; None otherwise."""
    forward = type(m).__dict__.get("forward")
    if forward is None or not isinstance(getattr(m, "weight", None), torch.nn.Parameter):
        return None
    found = _forms().get(source(forward))  # None (no source) is no form
    return found[0] if found and m.weight.dim() == 2 and isinstance(getattr(m, "top_k", None), int) else None


def _forward(router: torch.nn.Module, normalize, float_weights: bool, hidden_states: torch.Tensor):
    x = hidden_states.reshape(-1, router.hidden_dim)
    norm = router.norm_topk_prob if normalize is None else normalize
    return moe_router.route(x, router.weight, router.top_k, bool(norm), torch.float32 if float_weights else None)


def plan(model: torch.nn.Module) -> list[tuple[torch.nn.Module, functools.partial]]:
    """(router, forward) pairs to install while a lane runs ``model`` (empty where the kernels do not run)."""
    if not moe_router.available(model.device) or model.dtype == torch.float64:
        return []
    found = []
    for m in model.modules():
        kind = form(m)
        if kind is not None and m.weight.dtype != torch.float64:
            mixtral = kind == "mixtral"
            found.append((m, functools.partial(_forward, m, True if mixtral else None, mixtral)))
    return found
