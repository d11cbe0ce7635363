"""Normalized entropy of a next-token distribution (the seed paper's Eq. 1).

    H_t = -sum_i p_i log p_i / log V,   H_t in [0, 1]

V is the vocabulary both models share (the narrower of the two logit widths). The entropy
is computed on the model's *raw* distribution -- softmax of the unprocessed logits, at
temperature 1, before any logits processor (temperature, top-k, top-p, repetition
penalty, user processors). Reasons: the threshold then measures the model's own
uncertainty and means the same thing under greedy and sampled decoding; a top-k/top-p
warper would otherwise clip the distribution and push every entropy towards 0, and a
temperature would rescale it, so one tau could not be carried between settings.
"""

from __future__ import annotations

import math

import torch


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Normalized Shannon entropy of softmax(logits) along the last axis.

    Args:
        logits: ``[..., V]`` raw logits over the shared vocabulary (any float dtype).

    Returns:
        ``[...]`` float32 tensor in [0, 1]. Rows that are entirely ``-inf`` except one
        entry give exactly 0.
    """
    vocab = logits.shape[-1]
    if vocab < 2:
        raise ValueError(f"normalized entropy needs a vocabulary of at least 2 ids, got {vocab}")
    logp = torch.log_softmax(logits.float(), dim=-1)
    # p * log p with 0 * log 0 = 0: masked ids (logp = -inf) give 0 * -inf = nan, set to 0.
    # In place and without a mask tensor: on CPU this runs every decode step, and each op counts.
    plogp = logp.exp().mul_(logp).nan_to_num_(nan=0.0)
    return plogp.sum(dim=-1).div_(-math.log(vocab)).clamp_(0.0, 1.0)
