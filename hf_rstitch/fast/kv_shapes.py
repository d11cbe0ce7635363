"""The shape of a model's KV cache, read from what its layers store, not from its configuration.

A configuration may carry attributes its architecture ignores (a GPT-NeoX config with a
``num_key_value_heads``), name them differently (``num_kv_heads``, ``multi_query``), or have
layers whose keys and values differ (multi-head latent attention: keys of one head size, values
of another). :func:`kv_shape` runs one one-token forward with a recording cache (:class:`ShapeProbe`,
the same verbs as :class:`~hf_rstitch.fast.static_kv.StaticKV`) and returns what every layer
stored: ``(layers, kv_heads, head_dim)``. A model whose layers store nothing, store keys and
values of different shapes, or call a cache verb the static cache lacks, is refused
(:class:`KVShapeError`, with the reason): the fast engine's cache could not hold it.

The result is kept on the model (it depends on the architecture, not on the weights). The probe's one
forward routes the model's attention through the probe's function (a swap of ``config._attn_implementation``),
so probes take turns under one lock and a model is probed once: threads making their first ``generate`` calls
at once wait for the one probe and read its result, and never run a forward through another's swap.
"""

from __future__ import annotations

import inspect
import threading

import torch
from transformers import AttentionInterface

from .static_kv import static_attention, static_attention_on
from .windows import layer_windows

ATTRIBUTE = "_rstitch_kv_shape"  # on the model: (layers, kv_heads, head_dim) or the refusal's message


class KVShapeError(ValueError):
    """The model's layers store nothing one static cache of one shape can hold (the message says why)."""


class ShapeProbe:
    """A cache that keeps nothing: records the ``[b, H_kv, q, D]`` shapes each layer's ``update`` gets."""

    def __init__(self):
        self.stored: dict[int, list[tuple[tuple, tuple]]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.stored.setdefault(layer_idx, []).append((tuple(key_states.shape), tuple(value_states.shape)))
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0):
        return 0  # StaticKV answers with its device write offset


def kv_shape(model) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of the keys and values ``model``'s layers store (probed once, kept).

    Raises:
        KVShapeError: what the layers store does not fit one static cache (the message says why).
    """
    known = model.__dict__.get(ATTRIBUTE)
    if known is None:
        with _PROBING:  # one probe at a time: its swap and counters are the model's and this module's
            known = model.__dict__.get(ATTRIBUTE)  # another thread may have probed it while this one waited
            if known is None:
                known = model.__dict__[ATTRIBUTE] = _probe(model)
    if isinstance(known, str):
        raise KVShapeError(known)
    return known


PROBE = "rstitch_probe"
_PROBING = threading.Lock()  # held by the one probe running (kv_shape)
_ATTENDED = [0]  # calls of the probe's attention function during the current probe (under _PROBING)
_WINDOWS = [None]  # the probed model's layer windows: each layer's call is checked against them (.windows)


def _probe_attention(module, query, *args, **kwargs):
    _ATTENDED[0] += 1
    pos = torch.zeros((), dtype=torch.long, device=query.device)  # the probe's one token sits in slot 0
    return static_attention(module, query, *args, pos=pos, windows=_WINDOWS[0], **kwargs)


AttentionInterface.register(PROBE, _probe_attention)


def _probe(model) -> tuple[int, int, int] | str:
    name = type(model).__name__
    probe = ShapeProbe()
    _ATTENDED[0] = 0
    _WINDOWS[0] = layer_windows(model.config)
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"
    device = model.device
    try:
        with torch.no_grad(), static_attention_on(model, PROBE):
            model(input_ids=torch.full((1, 1), 3, device=device),
                  attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device),
                  position_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=True,
                  **{cache_arg: probe})
    except Exception as err:  # noqa: BLE001  (any failure here is a refusal, with its cause)
        return (f"{name}'s forward fails over the fast engine's static cache ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0][:160] if str(err).strip() else ''}); its layers need cache "
                "verbs or masks the fast engine does not provide")
    if not probe.stored:
        return (f"{name}'s layers store no keys and values in the cache (recurrent or state-space layers); the "
                "fast engine's cache holds attention keys and values only")
    if _ATTENDED[0] < len(probe.stored):
        return (f"{name}'s layers attend with code of their own instead of through transformers' attention "
                "interface (config._attn_implementation), so the fast engine's attention over its static cache "
                "would not run; use stitch_engine='default'")
    shapes = {shape for calls in probe.stored.values() for shape in calls}
    calls = {len(c) for c in probe.stored.values()}
    if calls != {1}:
        return f"{name}'s layers store into the cache more than once a forward; the fast engine's cache cannot hold it"
    if len(shapes) != 1:
        return (f"{name}'s layers store keys and values of several shapes {sorted(shapes)} (e.g. latent attention, "
                "per-layer head sizes); the fast engine's cache holds one [kv_heads, head_dim] shape")
    (key, value), = shapes
    if key != value:
        return (f"{name}'s keys {list(key)} and values {list(value)} differ in shape (e.g. multi-head latent "
                "attention); the fast engine's cache holds keys and values of one shape")
    return max(probe.stored) + 1, key[1], key[3]
