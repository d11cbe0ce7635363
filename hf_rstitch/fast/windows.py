"""Sliding-window and hybrid attention on the fast path: which window each layer has, and what an
attention call must honour besides its mask.

The static cache keeps every slot of every layer (no ring): a query at column ``p`` of a layer with
window ``W`` reads slots ``(p - W, p]`` only, as transformers' eager mask has it
(``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - W``, over columns, left padding
included). Keeping every slot leaves the cache's verbs (catch-ups of up to a bucket, rows moving,
shifting, joining) the same for every layer; the split kernel starts its reads at the window, so a
sliding layer reads ``W`` slots a step however long the sequence, as a ring would; the price is memory.

Where the windows come from: the eager engine's masks. A config with ``layer_types`` gets
``sliding_window`` on its ``"sliding_attention"`` layers (Gemma 2 / 3, OLMo 3, gpt-oss, Cohere 2,
EXAONE 4, Qwen2 with ``use_sliding_window``); one without (Mistral, Phi-3, Starcoder2, Qwen3-MoE,
Mixtral) gets ``sliding_window`` on every layer when it is set, as their models build the mask. Each
attention call cross-checks this against the ``sliding_window`` its layer passes (the window
transformers' flash-attention path applies) and raises on a disagreement, or where a windowed layer
passes none (Moshi builds a full mask despite its config's window), rather than decode other tokens
than the eager engine; the lane's shape probe (:mod:`.kv_shapes`) makes that a refusal before any lane
is built.

Besides the window, an attention call may carry ``softcap`` (Gemma 2: ``tanh`` capping of the scaled
scores) and ``s_aux`` (gpt-oss: one sink logit a head, in the softmax's denominator only); both are
honoured. Any other known score-changing argument (``sinks``) is refused.

What it does not do: layer kinds other than full and sliding attention (chunked, linear, indexed
attention, recurrent layers) -- :func:`why_not` names them.
"""

from __future__ import annotations

from transformers import PretrainedConfig, PreTrainedModel

KINDS = {"full_attention": False, "sliding_attention": True}  # layer type -> windowed
REFUSED_KWARGS = ("sinks",)  # score-changing attention arguments the static attentions do not apply
NO_WINDOW = 1 << 30  # the split kernel's window for a full-attention layer (longer than any cache)


def layer_windows(config: PretrainedConfig) -> list[int | None]:
    """The window of each layer (None: full attention), as the eager engine's masks apply them."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None) or None  # 0 (qwen2_moe's default) means none
    types = getattr(text, "layer_types", None)
    if types is None:
        return [window] * text.num_hidden_layers
    return [window if KINDS.get(kind) else None for kind in types]


def why_not(model: PreTrainedModel) -> str | None:
    """Why the fast engine's attention cannot run ``model``'s layers, in one line; None when it can."""
    text = model.config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    other = sorted(kinds - set(KINDS))
    if other:
        return (f"{type(model).__name__} has layer types {other}; the fast engine runs full and sliding-window "
                "attention layers only")
    windows = layer_windows(model.config)
    if any(w is not None and w < 1 for w in windows):
        return f"{type(model).__name__} has a sliding window of {min(w for w in windows if w is not None)}"
    return None


def supports_windows(model: PreTrainedModel) -> bool:
    """The fast engine runs ``model``'s attention layers (full and sliding-window ones)."""
    return why_not(model) is None


def call_window(module, kwargs: dict, windows) -> int | None:
    """The window of this attention call (None: full attention), checked against what the layer passes.

    Args:
        module: the attention layer (its ``layer_idx`` names the layer).
        kwargs: the call's keyword arguments (``sliding_window``, ``sinks``, ...).
        windows: :func:`layer_windows` of the model, or None (a caller that knows no model: the layer's
            own ``sliding_window``).
    """
    for name in REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"{type(module).__name__} passes {name}= to its attention function; the fast engine's "
                             "static attentions do not apply it. Use stitch_engine='default' for this model.")
    passed = kwargs.get("sliding_window", None) or None
    if windows is None:
        return passed
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        if any(w is not None for w in windows):
            raise ValueError(f"{type(module).__name__} has no layer_idx, so the fast engine cannot tell its window; "
                             "use stitch_engine='default' for this model.")
        return None
    want = windows[layer]
    if want is not None and "sliding_window" not in kwargs:
        raise ValueError(f"layer {layer} ({type(module).__name__}) passes no sliding_window to its attention function "
                         f"while its config has a window of {want}; the fast engine cannot tell whether the eager mask "
                         "applies it. Use stitch_engine='default' for this model.")
    if "sliding_window" in kwargs and passed != want:
        raise ValueError(f"layer {layer} ({type(module).__name__}) passes sliding_window={passed} but its config "
                         f"gives the eager mask a window of {want}; the fast engine cannot tell which applies. "
                         "Use stitch_engine='default' for this model.")
    return want
