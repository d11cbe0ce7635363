"""The fused normalized entropy (hf_rstitch.fast.kernels.fused_entropy) against the eager one of hf_rstitch.core.

On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed);
these tests skip when it is not there. On CUDA they run the compiled kernels.
"""

import pytest
import torch

from hf_rstitch.core.entropy import normalized_entropy
from hf_rstitch.fast.kernels import fused_entropy as fe

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


def _tied_logits(device, dtype, vocab):
    """Rows whose largest value repeats (across chunk boundaries), a row of -inf, a row with NaNs, a plain row."""
    torch.manual_seed(vocab)
    logits = torch.randn(6, vocab, device=device).to(dtype)
    logits[0, [5, 70, vocab - 1]] = 9.0  # first of three equal maxima
    logits[1, [vocab - 1, vocab - 2]] = 9.0  # equal maxima in the last chunk
    logits[2] = float("-inf")  # nothing finite: id 0, as torch.argmax
    logits[3, [40, vocab - 3]] = float("nan")  # the first NaN wins
    logits[4, ::2] = float("-inf")
    return logits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab,block", [(300, 32), (1000, 2048), (4099, 128)])
def test_read_out_equals_copy_entropy_and_argmax(device, dtype, vocab, block, monkeypatch):
    """One pass gives what the loop computed in three: the float32 copy (bit for bit), the entropy, and
    torch.argmax's token (first of equal maxima, first NaN, id 0 of a row of -inf)."""
    monkeypatch.setattr(fe, "BLOCK", block)
    logits = _tied_logits(device, dtype, vocab)
    copy, entropy, greedy = fe.read_out(logits)
    want = logits.float()
    assert copy.dtype == torch.float32 and copy.is_contiguous() and copy.data_ptr() != logits.data_ptr()
    assert torch.equal(copy.isnan(), want.isnan()) and torch.equal(copy.nan_to_num(), want.nan_to_num())
    assert greedy.dtype == torch.long and greedy.tolist() == torch.argmax(want, -1).tolist()
    finite = [0, 1, 2, 4, 5]
    torch.testing.assert_close(entropy[finite], normalized_entropy(logits)[finite], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_read_out_gathers_rows_of_a_wider_output(device, monkeypatch):
    """A lane's graph output is wider than the shared vocabulary and holds cache rows in slot order: the
    read-out takes the vocabulary's columns of the rows it is given, in that order."""
    monkeypatch.setattr(fe, "BLOCK", 64)
    torch.manual_seed(1)
    wide = torch.randn(5, 700, device=device, dtype=torch.bfloat16)
    view, index = wide[:, :650], torch.tensor([3, 0, 4], device=device)
    copy, entropy, greedy = fe.read_out(view, index)
    rows = view.index_select(0, index).float()
    assert copy.shape == (3, 650) and torch.equal(copy, rows)
    assert greedy.tolist() == rows.argmax(-1).tolist()
    torch.testing.assert_close(entropy, normalized_entropy(rows), atol=2e-6, rtol=1e-5)


def test_read_out_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="rows, vocab"):
        fe.read_out(torch.randn(2, 3, 10))
