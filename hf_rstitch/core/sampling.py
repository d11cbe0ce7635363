"""Turning processed scores into token ids, exactly as transformers' ``_sample`` does."""

from __future__ import annotations

import torch


def pick_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """Choose the next token per row.

    Args:
        scores: ``[B, V]`` processed scores (after logits processors and warpers).
        do_sample: multinomial sampling from softmax(scores) if True, else argmax.

    Returns:
        ``[B]`` long tensor of token ids.
    """
    if do_sample:
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    return torch.argmax(scores, dim=-1)


def pad_vocab(scores: torch.Tensor, width: int) -> torch.Tensor:
    """Pad ``[B, V]`` scores with -inf up to ``width`` so scores of both models stack."""
    extra = width - scores.shape[-1]
    if extra <= 0:
        return scores
    return torch.nn.functional.pad(scores, (0, extra), value=float("-inf"))


def sample_one(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> torch.Tensor:
    """One request's token from its logits ``[V]``: ``softmax(logits / temperature)`` restricted to the
    top-p nucleus, drawn with ``generator`` (a seeded request depends on nothing else). Any temperature > 0
    and top_p > 0 give a distribution: a tiny temperature tends to argmax, a tiny top_p keeps the top token."""
    logits = logits.float().cpu()
    scaled = logits / temperature
    if not torch.isfinite(scaled.max()):  # so small a temperature that logits / temperature overflows
        scaled = (logits.double() - logits.max()) / temperature  # the same softmax, the top token(s) at 0
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        keep[0] = True  # the most likely token, also when top_p underflows float32
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return torch.multinomial(probs, 1, generator=generator)[0]
