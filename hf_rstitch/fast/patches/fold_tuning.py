"""The one-row configurations of the products a layer folds its norms and adds into (:mod:`.folds`), tuned folded.

Why: a folded product is not the kernel the tuner times by shape alone. The q/k/v and gated kernels first reduce
their whole input row for the RMSNorm (in every program), o and down add the residual in their epilogue, and the
fastest configuration moves with that: on an H200 the Qwen3-8B gated MLP's configuration tuned by shape took
57.1 us folded against 49.6 us for the best folded one, its q/k/v 15.2 against 14.0 us; Qwen3-0.6B's q/k/v 4.5
against 3.8 us (``benchmarks/results/tuning_attention_nvidia_h200.md``). So for each shape of a foldable layer the one-row
tier is tuned again as it runs, under keys of their own (:data:`KINDS`), and the lane's forwards take those
configurations. Catch-ups and batches (several rows) never fold and keep the shape's tiers.

What it does not do: layers that do not fold (:func:`.folds.foldable`) keep the configurations tuned by shape.
"""

from __future__ import annotations

import functools

import torch

from . import add_norm, folds
from ..kernels import gated, gemv, shortlist, triton_support

KINDS = ("gemv+norm", "gemv+add", "gated+norm")  # the tuning table's names of the folded one-row products


def _key(kind: str, weights: tuple) -> tuple:
    """The table key of a folded one-row product: its kind, then the shape's key (a gated MLP's of its gate)."""
    weight, bias = (weights[0], None) if kind == "gated+norm" else weights
    return (kind,) + gemv.shape_key(weight, bias, 1)


def _kernel(kind: str):
    """The kernel module of ``kind`` (its tuner, search space and launch) and its name in :mod:`.shortlist`."""
    return (gated, "gated") if kind == "gated+norm" else (gemv, "gemv")


def folded(model: torch.nn.Module, installed: dict) -> list[tuple]:
    """:func:`_layer_folds` of every layer of ``model`` that folds at one row (``installed``: the lane's module ->
    forward), in layer order."""
    return [spec for layer in model.modules() if add_norm.pre_norm_layer(layer) and folds.foldable(layer, installed)
            for spec in _layer_folds(layer, installed)]


def one_row_config(target, installed: dict):
    """The one-row configuration ``target`` (of :func:`folded`) runs with now."""
    return installed[target].args[1][0] if isinstance(target, torch.nn.Module) else target.cfgs[0]


def _layer_folds(layer, installed: dict) -> list[tuple]:
    """``(kind, target, weights, fold)`` of ``layer``'s four folded products: the fused q/k/v group (its input
    norm), o (the residual add), the gated MLP (the post-attention norm) and down (the add). ``target`` is what
    holds the configurations: the group, or the module whose installed forward carries them."""
    attn, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    group = installed[attn.q_proj].func.__self__
    o, down = attn.o_proj, mlp.down_proj
    return [("gemv+norm", group, (group.weight, group.bias), dict(norm=n1.weight, eps=n1.variance_epsilon)),
            ("gemv+add", o, (o.weight, o.bias), dict(add=True)),
            ("gated+norm", mlp, (mlp.gate_proj.weight, mlp.up_proj.weight), dict(norm=n2.weight,
                                                                                 eps=n2.variance_epsilon)),
            ("gemv+add", down, (down.weight, down.bias), dict(add=True))]


def launch_for(kind: str, weights: tuple, fold: dict):
    """``run(cfg)``: one folded launch over stand-in inputs, for :func:`~.triton_support.precompile`."""
    w = weights[0]
    x = w.new_empty(1, w.shape[1])
    if kind == "gated+norm":
        return functools.partial(gated.launch, x, *weights, norm=fold["norm"], eps=fold["eps"])
    if kind == "gemv+norm":
        return functools.partial(gemv.launch, x, *weights, norm=fold["norm"], eps=fold["eps"])
    return functools.partial(gemv.launch, x, *weights, residual=w.new_empty(1, w.shape[0]))


def _candidates(kind: str) -> tuple:
    module, name = _kernel(kind)
    return shortlist.candidates(name, 1, module.TIER_CANDIDATES)


def _with_one_row(forward: functools.partial, cfg) -> functools.partial:
    """An installed forward ``func(module, cfgs, ...)`` with the one-row configuration of ``cfgs`` replaced."""
    module, cfgs, *rest = forward.args
    return functools.partial(forward.func, module, (cfg,) + tuple(cfgs[1:]), *rest, **forward.keywords)


def retune(model: torch.nn.Module, products: list, table: dict) -> list:
    """``products`` (the lane's (module, forward) pairs) with the one-row configuration of every folded product
    of the foldable layers tuned folded (``table`` keeps the choices under :data:`KINDS`)."""
    found = folded(model, dict(products))
    todo = {}
    for kind, _, weights, fold in found:
        if _key(kind, weights) not in table:
            todo.setdefault(_key(kind, weights), (kind, weights, fold))
    triton_support.precompile([(_candidates(kind), launch_for(kind, weights, fold)) for kind, weights, fold in todo.values()],
                              model.device)  # every candidate's kernel built at once, then timed one by one
    for key, (kind, weights, fold) in todo.items():
        table[key] = _kernel(kind)[0].tune(*weights, _candidates(kind), **fold)
    out = dict(products)
    for kind, target, weights, _ in found:
        cfg = table[_key(kind, weights)]
        if isinstance(target, torch.nn.Module):
            out[target] = _with_one_row(out[target], cfg)
        else:  # the fused q/k/v group keeps its configurations itself
            target.cfgs = (cfg,) + tuple(target.cfgs[1:])
    return [(m, out[m]) for m, _ in products]
