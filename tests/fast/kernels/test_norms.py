"""The hand-written norm, add + norm and SiLU-gate kernels (hf_rstitch.fast.kernels.norms) against the eager code
they replace.

Like test_gemv: on CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``); these tests skip
when it is not there. On CUDA they run compiled.
"""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hf_rstitch.fast.kernels import norms

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", norms.available("cpu")), ("cuda", CUDA and norms.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
DTYPES = [torch.float32, torch.bfloat16]


def _norm(k, dtype, device):
    torch.manual_seed(k)
    norm = LlamaRMSNorm(k, eps=1e-6).to(device, dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k", [(1, 64), (3, 1500)])
def test_rms_norm_equals_llama_rms_norm(device, dtype, rows, k):
    norm = _norm(k, dtype, device)
    x = torch.randn(rows, 2, k, device=device).to(dtype)
    with torch.no_grad():
        got, want = norms.norm_forward(norm, None, x), norm(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    # bfloat16: a last-bit difference (Triton's interpreter rounds to bfloat16 otherwise than CUDA does)
    torch.testing.assert_close(got, want, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k", [(1, 64), (5, 1500)])
def test_add_rms_norm_equals_the_add_then_the_norm(device, dtype, rows, k):
    from hf_rstitch.fast.patches.add_norm import _add_norm

    norm = _norm(k, dtype, device)
    residual, h = (torch.randn(rows, k, device=device).to(dtype) for _ in range(2))
    piece = norms.add_norm_piece(lambda *a: pytest.fail("the kernel should take these tensors"))
    with torch.no_grad():
        total, normed = piece(norm, residual, h)
        want_total, want_normed = _add_norm(norm, residual, h)
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)  # the interpreter's bfloat16 rounding
    torch.testing.assert_close(total, want_total, **tol)
    torch.testing.assert_close(normed, want_normed, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_equals_silu_times_up(device, dtype):
    gate, up = (torch.randn(3, 2500, device=device).to(dtype) for _ in range(2))
    got = norms.silu_mul_piece(lambda *a: pytest.fail("the kernel should take these tensors"))(gate, up)
    torch.testing.assert_close(got, F.silu(gate) * up, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))


@pytest.mark.parametrize("device", DEVICES)
def test_other_norms_and_shapes_take_the_fallback(device):
    norm = _norm(64, torch.float32, device)
    calls = []
    fallback = lambda *a: calls.append(a) or "fallback"  # noqa: E731
    assert norms.norm_forward(norm, fallback, torch.randn(2, 32, device=device)) == "fallback"  # another width
    assert norms.norm_forward(norm, fallback, torch.randn(2, 64, device=device).double()) == "fallback"

    class OtherNorm(torch.nn.Module):  # not Llama's RMSNorm to the letter
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(64, device=device)), 1e-6

        def forward(self, x):
            return x * 2

    x = torch.randn(2, 64, device=device)
    assert norms.add_norm_piece(fallback)(OtherNorm(), x, x) == "fallback"
    assert len(calls) == 3


@pytest.mark.parametrize("device", DEVICES)
def test_parts_without_dynamo_equal_default_engine(device):
    """``compile="parts"`` on a Llama-family pair where Triton runs: the norms, the adds with their norms and the
    SiLU gate are these kernels, so the process compiles nothing with torch.compile (no dynamo tracing: the warm
    first call's largest part), and the outputs equal the eager engine's (float32 rounding)."""
    from torch._dynamo.utils import counters

    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine
    from tiny_models import make_pair, prompt

    llm, slm = (m.float().to(device) for m in make_pair("qwen2-full"))
    route = ["slm"] * 3 + ["llm"] * 6 + ["slm"] * 2 + ["llm"]
    graphs = counters["stats"]["unique_graphs"]
    outs = [llm.generate(prompt(12).to(device), assistant_model=slm, stitch_policy=ReplayPolicy(route),
                         stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                         return_dict_in_generate=True, output_logits=True)
            for engine in (FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda", compile="parts")), "default")]
    assert counters["stats"]["unique_graphs"] == graphs  # nothing traced by dynamo
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
