"""Residual adds fused with the norms after them (``FastConfig(compile="parts", fuse_add_norm=True)``).

Why: a pre-norm decoder layer adds its attention output to the residual stream, then normalizes
the sum for its MLP; it adds the MLP output, then the next layer normalizes that sum. With
``compile="parts"`` each norm is one kernel and each add another: two kernels a layer that one
compiled piece, ``(residual + h, norm(residual + h))``, replaces.

How: each layer whose ``forward`` computes what Llama's does -- shown by a probe at plan time that runs both
with the layer's norms, attention and MLP replaced by random stand-ins (:func:`verdict`) -- runs
:func:`_layer_forward`: the middle add and the MLP's norm in one piece, and
the closing add with the *next* layer's input norm in one piece, whose norm is handed to that layer
through a carry. A layer uses the carried norm only when its input is the very tensor the carry
holds and its own input norm made it; anything else (hooks, another order of layers) computes its
norm as usual. Same arithmetic as the layer's own code: the sum is rounded to the model's dtype
before it is normalized.

What it does not do: other layer shapes (post-norm, parallel attention and MLP, extra norms); the
last layer's closing add (the model's final norm is its own).
"""

from __future__ import annotations

import copy
import functools
import inspect

import torch

from .. import probes
from . import folds


def _add_norm(norm: torch.nn.Module, residual: torch.Tensor, h: torch.Tensor):
    """``residual + h`` and its norm."""
    total = residual + h
    return total, type(norm).forward(norm, total)


PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")  # what _layer_forward calls


def pre_norm_layer(m: torch.nn.Module) -> bool:
    """A decoder layer that computes what :func:`_layer_forward` computes (:func:`verdict`): the only layers it
    may stand in for."""
    return verdict(m).same


def verdict(m: torch.nn.Module) -> probes.Verdict:
    """Whether :func:`_layer_forward` may stand in for the decoder layer ``m``'s forward: a probe runs both with
    the layer's norms, attention and MLP replaced by seeded random stand-ins (:func:`_layer_probe`)."""
    if not type(m).__name__.endswith("DecoderLayer"):
        return probes.Verdict(False, None, "not a decoder layer")
    missing = [name for name in PARTS if not isinstance(getattr(m, name, None), torch.nn.Module)]
    if missing:
        return probes.Verdict(False, None, f"no {' / '.join(missing)}: not a pre-norm layer")
    return probes.once(m, "pre-norm layer", _layer_probe)


RANK = 16  # the stand-ins' mixing rank: every hidden unit feeds every other, at O(d) random values, not O(d**2)


class _StandIn(torch.nn.Module):
    """A seeded random map that notes how it was called, put in place of a layer's part by the layer probe:
    ``tanh(x) * w`` for a norm; for the attention and the MLP ``tanh(x * w + (x @ a) @ b)`` (a diagonal plus a
    rank-:data:`RANK` mixing part: near one-to-one, and a hidden state's units all reach each other), the
    attention's as ``(out, None)``. The mixing is low-rank so that a 7B layer's probe draws ~10^5 values, not
    ~10^7 (a d x d matrix a part, four a probe, on the CPU: a minute over a 7B/1.5B pair's 56 layers)."""

    def __init__(self, w: torch.Tensor, mix: tuple[torch.Tensor, torch.Tensor] | None = None,
                 attention: bool = False):
        super().__init__()
        self.w, self.mix, self.attention, self.calls = w, mix, attention, []

    def forward(self, *args, **kwargs):
        x = args[0] if args else kwargs.pop("hidden_states")
        self.calls.append((args[1:], kwargs))  # what it was called with besides its input
        if self.mix is None:
            return torch.tanh(x) * self.w
        a, b = self.mix
        out = torch.tanh(x * self.w + (x @ a) @ b)
        return (out, None) if self.attention else out


def _stand_ins(d: int, like: torch.Tensor) -> dict[str, _StandIn]:
    gen = probes.generator()

    def mixing(attention: bool = False) -> _StandIn:
        return _StandIn(probes.randn(d, like=like, gen=gen),
                        (probes.randn(d, RANK, like=like, gen=gen, scale=d ** -0.5),
                         probes.randn(RANK, d, like=like, gen=gen, scale=RANK ** -0.5)), attention)

    return {"input_layernorm": _StandIn(probes.randn(d, like=like, gen=gen)),
            "post_attention_layernorm": _StandIn(probes.randn(d, like=like, gen=gen)),
            "self_attn": mixing(attention=True), "mlp": mixing()}


def _layer_probe(m: torch.nn.Module) -> probes.Verdict:
    """The layer's forward and :func:`_layer_forward` on seeded random hidden states, its parts replaced by
    :class:`_StandIn` s (in a shallow copy: the model is not touched), with the keywords a model passes its layers
    (those the forward names): equal outputs, and the attention and the MLP called with the same arguments."""
    like = next(m.parameters())
    norm_w = getattr(m.input_layernorm, "weight", None)
    d = norm_w.shape[-1] if isinstance(norm_w, torch.Tensor) and norm_w.dim() == 1 else 16
    gen = probes.generator()
    x = probes.randn(1, 3, d, like=like, gen=gen, scale=3.0)
    kwargs = _layer_kwargs(type(m).forward, x, gen)
    runs = []
    for run in (lambda c: type(m).forward(c, x, **kwargs),
                lambda c: _layer_forward(c, _add_norm, None, _Carry(), False, x, **kwargs)):
        parts = _stand_ins(d, like)
        clone = copy.copy(m)
        clone._modules = {**m._modules, **parts}
        runs.append((run(clone), [parts[name].calls for name in ("self_attn", "mlp")]))
    (want, want_calls), (got, got_calls) = runs
    if not _same_calls(want_calls, got_calls):
        return probes.Verdict(False, None, "probe differs (its attention or MLP is called with other arguments)")
    return probes.equal(got, want)


def _layer_kwargs(forward, x: torch.Tensor, gen: torch.Generator) -> dict:
    """The keywords a model passes its decoder layers, those ``forward`` names (a marker among its ``**kwargs``)."""
    b, q, d = x.shape
    known = {"attention_mask": torch.ones(b, 1, q, q, dtype=torch.bool, device=x.device),
             "position_ids": torch.arange(q, device=x.device)[None],
             "position_embeddings": (probes.randn(b, q, d, like=x, gen=gen), probes.randn(b, q, d, like=x, gen=gen)),
             "use_cache": False, "cache_position": torch.arange(q, device=x.device)}
    params = inspect.signature(forward).parameters
    found = {k: v for k, v in known.items() if k in params}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        found["probe_marker"] = object()
    return found


def _same_calls(a: list, b: list) -> bool:
    """The parts were called as often, with the same objects (or equal values that are not tensors)."""
    def same(u, v):
        if isinstance(u, (tuple, list)) and isinstance(v, (tuple, list)):
            return len(u) == len(v) and all(same(i, j) for i, j in zip(u, v))
        if isinstance(u, dict) and isinstance(v, dict):
            return u.keys() == v.keys() and all(same(u[k], v[k]) for k in u)
        return u is v or (not isinstance(u, torch.Tensor) and not isinstance(v, torch.Tensor) and u == v)

    return same(a, b)


class _Carry:
    """The closing sum of the layer that ran last and its norm, made for the layer that runs next."""

    def __init__(self):
        self.total = self.normed = self.norm = None

    def take(self, hidden_states: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor | None:
        found = self.normed if self.total is hidden_states and self.norm is norm else None
        self.total = self.normed = self.norm = None
        return found


def _layer_forward(layer, add_norm, next_norm, carry: _Carry, fold: bool, hidden_states: torch.Tensor, *args,
                   **kwargs) -> torch.Tensor:
    if args:  # called positionally: the layer's own forward (which these keywords would not match)
        return type(layer).forward(layer, hidden_states, *args, **kwargs)
    bound = inspect.signature(type(layer).forward).bind(layer, hidden_states, **kwargs)
    bound.apply_defaults()
    named = {k: v for k, v in bound.arguments.items() if k not in ("self", "hidden_states", "kwargs")}
    named.update(bound.arguments.get("kwargs", {}))
    if fold and hidden_states.numel() == hidden_states.shape[-1]:  # one row: adds and norms in the products
        return _folded(layer, hidden_states, named)
    normed = carry.take(hidden_states, layer.input_layernorm)
    if normed is None:
        normed = layer.input_layernorm(hidden_states)
    h, _ = layer.self_attn(hidden_states=normed, **named)
    residual, h = add_norm(layer.post_attention_layernorm, hidden_states, h)
    out = layer.mlp(h)
    if next_norm is None:
        return residual + out
    total, carry.normed = add_norm(next_norm, residual, out)
    carry.total, carry.norm = total, next_norm
    return total


def _folded(layer, hidden_states: torch.Tensor, named: dict) -> torch.Tensor:
    """The layer at one row with its adds and norms folded into its products (:mod:`.folds`)."""
    attn, mlp = layer.self_attn, layer.mlp
    with folds.folding((hidden_states, layer.input_layernorm), (attn.o_proj, hidden_states)):
        residual, _ = attn(hidden_states=hidden_states, **named)  # o's output plus the layer's input
    with folds.folding((residual, layer.post_attention_layernorm), (mlp.down_proj, residual)):
        return mlp(residual)  # down's output plus the residual: the layer's output


def plan(model: torch.nn.Module, compiled, products=(),
         fold: bool = True) -> list[tuple[torch.nn.Module, functools.partial]]:
    """The layer forwards to install; ``compiled(key, fn)`` compiles a piece (:mod:`.regions`). With ``fold`` (the
    lane plan's ``fold_norms``), layers whose products (``products``: the lane's installed (module, forward)
    pairs) take folds run one-row calls folded (:func:`.folds.foldable`)."""
    layers = [m for m in model.modules() if pre_norm_layer(m)]
    installed = dict(products)
    carry = _Carry()
    forwards = []
    for i, layer in enumerate(layers):
        norm_cls = type(layer.post_attention_layernorm)
        following = layers[i + 1].input_layernorm if i + 1 < len(layers) else None
        following = following if type(following) is norm_cls else None
        piece = compiled(("add_norm", norm_cls), _add_norm)
        folded = fold and folds.foldable(layer, installed)
        forwards.append((layer, functools.partial(_layer_forward, layer, piece, following, carry, folded)))
    return forwards
