"""The fused normalized entropy (hf_rstitch.fast.fused_entropy) against the eager one of hf_rstitch.core.

On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed);
these tests skip when it is not there. On CUDA they run the compiled kernels.
"""

import pytest
import torch

from hf_rstitch.core.entropy import normalized_entropy
from hf_rstitch.fast import fused_entropy as fe

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", fe.available("cpu")), ("cuda", CUDA and fe.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab,block", [(1, 1000, 2048), (3, 1000, 64), (5, 517, 32), (2, 4099, 128)])
def test_equals_the_eager_entropy(device, dtype, rows, vocab, block, monkeypatch):
    """One chunk a row or many (small blocks, many programs), several blocks a chunk; logits of every
    scale from near-uniform to peaked."""
    monkeypatch.setattr(fe, "BLOCK", block)
    torch.manual_seed(rows * vocab)
    scale = torch.tensor([0.01, 1.0, 8.0, 30.0, 3.0][:rows], device=device)[:, None]
    logits = (torch.randn(rows, vocab, device=device) * scale).to(dtype)
    got = fe.normalized_entropy(logits)
    assert got.dtype == torch.float32 and got.shape == (rows,)
    torch.testing.assert_close(got, normalized_entropy(logits), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_ids_count_zero(device, monkeypatch):
    """-inf logits (ids a processor or the shared vocabulary masks) add nothing; one finite id gives 0;
    a row masked everywhere gives 0; leading dimensions are kept."""
    monkeypatch.setattr(fe, "BLOCK", 64)
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 300, device=device)
    logits[0, 0, ::3] = float("-inf")
    logits[0, 1, :] = float("-inf")
    logits[0, 1, 7] = 2.0
    logits[1, 2, :] = float("-inf")
    got = fe.normalized_entropy(logits)
    assert got.shape == (2, 3)
    want = normalized_entropy(logits)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert got[0, 1] == 0.0 and got[1, 2] == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_a_strided_view_is_read_as_it_is(device):
    """The lanes hand over a slice of wider logits (the shared vocabulary): no copy is needed."""
    wide = torch.randn(4, 700, device=device)
    view = wide[:, :650]
    assert fe.supported(view)
    torch.testing.assert_close(fe.normalized_entropy(view), normalized_entropy(view), atol=2e-6, rtol=1e-5)


def test_what_it_takes():
    assert not fe.supported(torch.randn(3, 10, dtype=torch.float64))
    assert not fe.supported(torch.randn(10, 3).t())  # ids not contiguous
    assert not fe.supported(torch.randn(3, 1))
