import math

import pytest
import torch

from hf_rstitch.core.entropy import normalized_entropy


def test_uniform_is_one_and_onehot_is_zero():
    assert normalized_entropy(torch.zeros(3, 50)).tolist() == pytest.approx([1.0] * 3)
    peaked = torch.full((1, 50), float("-inf"))
    peaked[0, 7] = 0.0
    assert normalized_entropy(peaked).item() == 0.0


def test_hand_value():
    p = torch.tensor([0.5, 0.25, 0.25, 0.0])
    logits = torch.log(p)  # -inf for the zero entry
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)) / math.log(4)
    assert normalized_entropy(logits).item() == pytest.approx(expected, rel=1e-6)


def test_batched_shape_and_low_precision_input():
    x = torch.randn(2, 3, 11, dtype=torch.bfloat16)
    h = normalized_entropy(x)
    assert h.shape == (2, 3) and h.dtype == torch.float32
    assert ((h >= 0) & (h <= 1)).all()


def test_rejects_single_token_vocab():
    with pytest.raises(ValueError, match="at least 2"):
        normalized_entropy(torch.zeros(1, 1))


def _entropy_by_mask(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 1 written out with an explicit finiteness mask (the form the in-place version replaced)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    plogp = torch.where(logp.isfinite(), logp.exp() * logp, torch.zeros_like(logp))
    return (-plogp.sum(dim=-1) / math.log(logits.shape[-1])).clamp_(0.0, 1.0)


def test_bit_identical_to_the_masked_form():
    """Traces and routing compare entropies to tau, so the fast form must not move a single bit,
    masked ids (-inf) and all-but-one-masked rows included."""
    g = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 30.0, 1e3):
        logits = torch.randn(64, 131, generator=g) * scale
        logits[::3, torch.randint(0, 131, (40,), generator=g)] = float("-inf")
        logits[5] = float("-inf")
        logits[5, 9] = 2.0
        assert torch.equal(normalized_entropy(logits), _entropy_by_mask(logits))
