"""Residual adds fused with the norms after them (``FastConfig(compile="parts", fuse_add_norm=True)``).

Why: a pre-norm decoder layer adds its attention output to the residual stream, then normalizes
the sum for its MLP; it adds the MLP output, then the next layer normalizes that sum. With
``compile="parts"`` each norm is one kernel and each add another: two kernels a layer that one
compiled piece, ``(residual + h, norm(residual + h))``, replaces.

How: each layer whose ``forward`` is Llama's to the letter (Llama, Qwen2, Qwen3 and Mistral share it;
:func:`pre_norm_layer`) runs :func:`_layer_forward`: the middle add and the MLP's norm in one piece, and
the closing add with the *next* layer's input norm in one piece, whose norm is handed to that layer
through a carry. A layer uses the carried norm only when its input is the very tensor the carry
holds and its own input norm made it; anything else (hooks, another order of layers) computes its
norm as usual. Same arithmetic as the layer's own code: the sum is rounded to the model's dtype
before it is normalized.

What it does not do: other layer shapes (post-norm, parallel attention and MLP, extra norms); the
last layer's closing add (the model's final norm is its own).
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..source_text import source
from . import folds


def _add_norm(norm: torch.nn.Module, residual: torch.Tensor, h: torch.Tensor):
    """``residual + h`` and its norm."""
    total = residual + h
    return total, type(norm).forward(norm, total)


@functools.lru_cache(maxsize=1)
def _pre_norm_source() -> str:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return source(LlamaDecoderLayer.forward)


def pre_norm_layer(m: torch.nn.Module) -> bool:
    """A decoder layer whose forward is, to the letter, the pre-norm one of Llama: the only layers
    :func:`_layer_forward` may stand in for."""
    forward = type(m).__dict__.get("forward")
    if not type(m).__name__.endswith("DecoderLayer") or forward is None:
        return False
    return source(forward) == _pre_norm_source()  # None (no source) never equals it


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
