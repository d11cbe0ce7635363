"""Which MoE routers of a model run the router kernels (:mod:`hf_rstitch.fast.kernels.moe_router`), and the
forward they run.

A router runs them only where it computes, on random tokens at plan time (:mod:`hf_rstitch.fast.probes`), what one
of the two forms transformers ships for top-k softmax routing computes (:func:`form`):

* Qwen3-MoE's (``Qwen3MoeTopKRouter``, and the routers that compute as it does): softmax, top-k, divided by the
  top-k sum where ``norm_topk_prob``, weights cast back to the logits' dtype;
* Mixtral's (``MixtralTopKRouter``, and the routers that compute as it does): softmax, top-k, always divided by
  the sum, weights left in float32.

Anything else (a bias, sigmoid or grouped scoring, jitter) keeps its code, the probe's reason in the plan; so do
float64 models and devices where Triton does not run. The installed forward returns what the module returns:
``(logits, weights, ids)``.
"""

from __future__ import annotations

import functools

import torch

from .. import probes
from ..kernels import moe_router

FORMS = {"qwen3_moe": (None, False), "mixtral": (True, True)}  # form -> (renormalizes: None reads norm_topk_prob,
# weights in float32)


def verdict(m: torch.nn.Module) -> tuple[str | None, probes.Verdict]:
    """``(form, verdict)``: the first form of :data:`FORMS` whose arithmetic (:func:`~hf_rstitch.fast.probes.
    router_reference`) ``m`` returns on random tokens (random weight), and the probe's verdict; ``(None, why)``
    where none does or ``m`` is not a router the kernels read (a 2-D weight, an int ``top_k``, ``hidden_dim``)."""
    if not (isinstance(getattr(m, "weight", None), torch.nn.Parameter) and m.weight.dim() == 2
            and isinstance(getattr(m, "top_k", None), int) and isinstance(getattr(m, "hidden_dim", None), int)):
        return None, probes.Verdict(False, None, "not a router the kernels read (a 2-D weight, top_k, hidden_dim)")
    found = [(kind, probes.once(m, f"router {kind}", functools.partial(_probe, kind))) for kind in FORMS]
    for kind, v in found:
        if v.same:
            return kind, v
    return None, min((v for _, v in found), key=lambda v: float("inf") if v.err is None else v.err)


def form(m: torch.nn.Module) -> str | None:
    """``"qwen3_moe"`` or ``"mixtral"``: the router form ``m`` computes (:func:`verdict`); None otherwise."""
    return verdict(m)[0]


def _probe(kind: str, m: torch.nn.Module) -> probes.Verdict:
    gen = probes.generator()
    x = probes.randn(5, m.hidden_dim, like=m.weight, gen=gen)
    params = probes.random_params(m, gen)
    normalize, float_weights = FORMS[kind]
    if normalize is None and not isinstance(getattr(m, "norm_topk_prob", None), bool):
        return probes.Verdict(False, None, "no norm_topk_prob")
    normalize = m.norm_topk_prob if normalize is None else normalize
    want = probes.router_reference(x, params.get("weight", m.weight), m.top_k, normalize, float_weights)
    got = probes.run_with(m, params, x)
    return probes.equal(tuple(got) if isinstance(got, (tuple, list)) else got, want)


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
