"""How many tokens of KV cache a pair's paged pools get from the GPU memory left after loading the pair.

Both lanes hold every token of every row (the stitch loop brings both models up to date), so a token costs
the sum of the two models' bytes a token -- keys and values of every layer (:func:`kv_bytes_per_token`) --
and both pools get the same number of tokens. The server (``rstitch serve``) sizes them with
:func:`kv_tokens_on_device` once the pair is loaded: the pools may fill the device up to ``fraction`` of its
memory; the rest stays for the CUDA graphs' activations, the lanes' other buffers and the CUDA context.

Worked numbers for Qwen2-7B / Qwen2-1.5B in bfloat16 (``docs/serving.md``): 57,344 + 28,672 = 86,016 bytes a
token; with about 19.4 GB of weights (and the fast engine's fused q/k/v copies) on one H100 80GB (85.0 GB)
and ``fraction=0.9``, 56.6 GB of KV: 658k tokens, 20 rows at a full 32k tokens or 64 rows at ~10k each; on
an H200 (150.7 GB) 115.8 GB: 1.35M tokens, 41 full 32k rows or 64 rows at ~21k each.
"""

from __future__ import annotations

import torch

from .blocks import BLOCK_TOKENS
from .kv_shapes import kv_shape

HEADROOM = 0.1  # of the device's memory, kept free of KV blocks (graphs, activations, buffers)


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token takes in ``model``'s cache (every layer, in the model's dtype)."""
    layers, kv_heads, head_dim = kv_shape(model)
    return 2 * layers * kv_heads * head_dim * model.dtype.itemsize


def kv_tokens_for(bytes_per_token: list[int], free_bytes: int, total_bytes: int, fraction: float = 1 - HEADROOM,
                  block: int = BLOCK_TOKENS) -> int:
    """Tokens each lane's pool may hold (whole blocks) when ``free_bytes`` of ``total_bytes`` are free now and the
    device may be filled up to ``fraction``: ``(free - (1 - fraction) * total) / sum(bytes_per_token)``, 0 when
    nothing is left."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the KV memory fraction must be in (0, 1], got {fraction!r}")
    room = free_bytes - (1 - fraction) * total_bytes
    tokens = int(max(room, 0) // sum(bytes_per_token))
    return tokens // block * block


def kv_tokens_on_device(llm, slm, fraction: float = 1 - HEADROOM) -> int:
    """:func:`kv_tokens_for` with the free memory of the LLM's CUDA device now (the pair loaded, nothing else
    of the engine built yet). Raises ValueError off CUDA."""
    device = llm.device
    if device.type != "cuda":
        raise ValueError(f"KV memory is sized from a CUDA device's free memory; the LLM is on {device}")
    free, total = torch.cuda.mem_get_info(device)
    return kv_tokens_for([kv_bytes_per_token(llm), kv_bytes_per_token(slm)], free, total, fraction)
