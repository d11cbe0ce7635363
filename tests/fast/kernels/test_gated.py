"""The gated-MLP kernel (hf_rstitch.fast.kernels.gated) against the module's eager arithmetic.

Like test_gemv: on CPU the kernel runs only under Triton's interpreter (``TRITON_INTERPRET=1``);
these tests skip when it is not there. On CUDA they run the compiled kernel.
"""

import pytest
import torch
from tiny_models import assert_compiles_like_eager, assert_wide_tier_runs, kernel_model

from hf_rstitch.fast.kernels import gated, gemv
from hf_rstitch.fast.patches import gated_mlp, linears

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")), ("cuda", CUDA and gemv.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


def _weights(n, k, dtype, device):
    torch.manual_seed(0)
    return [torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5 for _ in range(2)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(64, 96), (37, 130), (256, 1024)])
@pytest.mark.parametrize("cfg", [gemv.GemvConfig(), gemv.GemvConfig(4, 128, 4, 2), gemv.GemvConfig(16, 256, 8, 2)])
def test_one_row_equals_module_arithmetic(device, n, k, cfg):
    g, u = _weights(n, k, torch.float32, device)
    x = torch.randn(1, 1, k, device=device)
    torch.testing.assert_close(gated.launch(x, g, u, cfg), gated.reference(x, g, u), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(64, 96), (37, 130), (256, 1024)])
@pytest.mark.parametrize("cfg", [gemv.GemvConfig(), gemv.GemvConfig(4, 128, 4, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_before_the_one_row_product(device, n, k, cfg, dtype):
    """An RMSNorm folded in front of the one-row kernel (hf_rstitch.fast.patches.folds): the module on norm(x)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    g, u = _weights(n, k, dtype, device)
    norm = Qwen2RMSNorm(k, eps=1e-6).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k) + 0.5)
        x = torch.randn(1, 1, k, device=device).to(dtype)
        tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.07, rtol=0.02)
        torch.testing.assert_close(gated.launch(x, g, u, cfg, norm.weight, norm.variance_epsilon),
                                   gated.reference(norm(x), g, u), **tol)
    with pytest.raises(ValueError, match="one-row kernel only"):
        gated.launch(x.expand(1, 2, k), g, u, gated.FEW_ROWS[0], norm.weight, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,cfg", [(2, gated.FEW_ROWS[0]), (5, gated.FEW_ROWS[0]), (gemv.MAX_ROWS, gated.FEW_ROWS[0]),
                                      (gemv.MAX_ROWS + 1, gated.WIDE[0]), (gemv.WIDE_ROWS, gated.WIDE[5]),
                                      # the reduction in splits (the last one shorter), summed, then the activation
                                      (3, gemv.GemvConfig(16, 32, 4, 2, 16, 3)), (40, gemv.GemvConfig(32, 64, 4, 3, 64, 2))])
@pytest.mark.parametrize("n,k", [(64, 96), (37, 130)])
def test_few_rows_equal_module_arithmetic(device, rows, cfg, n, k):
    g, u = _weights(n, k, torch.float32, device)
    x = torch.randn(1, rows, k, device=device)
    got = gated.launch(x, g, u, cfg)
    torch.testing.assert_close(got, gated.reference(x, g, u), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif("cuda" not in DEVICES, reason="Triton's CPU interpreter does not round to bf16 as devices do")
def test_low_precision_rounds_like_the_module():
    """bf16: each product, the SiLU and the result are rounded as the eager module rounds them."""
    device = "cuda"
    g, u = _weights(128, 256, torch.bfloat16, device)
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=device)
    got = gated.launch(x, g, u, gemv.GemvConfig())
    want = gated.reference(x, g, u)
    # the products' float32 sums differ only in order: at most one bf16 step apart
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2 ** -7 + 1e-3).all()


@pytest.mark.parametrize("device", DEVICES)
def test_refuses_wrong_shapes(device):
    g, u = _weights(8, 16, torch.float32, device)
    with pytest.raises(ValueError, match="two weights of one shape"):
        gated.launch(torch.randn(1, 16, device=device), g, u[:4], gemv.GemvConfig())
    with pytest.raises(ValueError, match="1..1 row"):
        gated.launch(torch.randn(2, 16, device=device), g, u, gemv.GemvConfig())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mlps_on_model_equal_and_restored(device, arch):
    model = kernel_model(device, arch)
    table = {}
    patches = gated_mlp.plan(model, table)
    mlps = [layer.mlp for layer in model.model.layers]
    assert [m for m, _ in patches] == mlps
    one, several, many = (torch.randint(0, 97, (1, n), device=device) for n in (1, 5, gemv.MAX_ROWS + 3))
    with torch.no_grad():
        want = [model(ids).logits for ids in (one, several, many)]
        with linears.gemv_linears_on(patches):
            assert all("forward" in m.__dict__ for m in mlps)
            got = [model(ids).logits for ids in (one, several, many)]
    assert not any("forward" in m.__dict__ for m in mlps)  # restored
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[2], want[2])  # more than MAX_ROWS rows: the module's own forward


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_through_custom_op(device):
    model = kernel_model(device, "qwen2")
    assert_compiles_like_eager(model, gated_mlp.plan(model, {}), device)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_skips_what_the_kernel_cannot_fuse(device):
    model = kernel_model(device, "llama")
    first, second = model.model.layers[0].mlp, model.model.layers[1].mlp
    first.gate_proj.bias = torch.nn.Parameter(torch.zeros(first.gate_proj.out_features, device=device))
    second.act_fn = torch.nn.GELU()
    assert gated_mlp.plan(model, {}) == []


@pytest.mark.parametrize("device", DEVICES)
def test_wide_inputs_use_the_given_activation_product(device):
    """Past MAX_ROWS rows the two products run apart and ``act_mul`` (compile="parts": its compiled one) joins them."""
    model = kernel_model(device, "qwen2")
    seen = []

    def act_mul(gate, up):
        seen.append(gate.shape[-2])
        return torch.nn.functional.silu(gate) * up

    many = torch.randint(0, 97, (1, gemv.MAX_ROWS + 3), device=device)
    with torch.no_grad():
        want = model(many).logits
        with linears.gemv_linears_on(gated_mlp.plan(model, {}, act_mul)):
            got = model(many).logits
    assert seen == [gemv.MAX_ROWS + 3] * 2  # both layers
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_lane_of_64_rows_runs_the_wide_tier(device):
    """Tuned for 64 rows (a lane built for a batch of 64), inputs of 17..64 rows run the kernel's wide tier;
    more rows keep the module's own forward. Tuned for the default 16, the wide tier is never tuned."""
    model = kernel_model(device, "qwen2")
    assert all(cfgs[2] is None for _, fn in gated_mlp.plan(model, {}) for cfgs in [fn.args[1]])
    patches = gated_mlp.plan(model, {}, max_rows=gemv.WIDE_ROWS)
    assert all(fn.args[1][2] is not None or device == "cuda" for _, fn in patches)  # on CUDA cuBLAS may win
    assert_wide_tier_runs(model, patches, device)
