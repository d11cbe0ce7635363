"""The batch-1 Triton GEMV kernel (hf_rstitch.fast.kernels.gemv) against F.linear.

On CPU the kernel runs only under Triton's interpreter (``TRITON_INTERPRET=1`` with triton
installed); these tests skip when it is not there. On CUDA they run the compiled kernel.
"""

import pytest
import torch
from tiny_models import assert_compiles_like_eager, assert_wide_tier_runs, kernel_model

from hf_rstitch.fast.kernels import gemv
from hf_rstitch.fast.patches import linears

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")), ("cuda", CUDA and gemv.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (37, 130, False), (512, 1024, True), (3, 2048, False)])
@pytest.mark.parametrize("cfg", [gemv.GemvConfig(), gemv.GemvConfig(4, 128, 4, 2), gemv.GemvConfig(32, 256, 8, 4)])
def test_gemv_equals_linear(device, n, k, bias, cfg):
    torch.manual_seed(n + k)
    w = torch.randn(n, k, device=device)
    b = torch.randn(n, device=device) if bias else None
    x = torch.randn(1, 1, k, device=device)
    y = gemv.launch(x, w, b, cfg)
    assert y.shape == (1, 1, n)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-4)


def _rms_norm(k, dtype, device):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(k, eps=1e-6).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k) + 0.5)
    return norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (37, 130, False), (512, 1024, False)])
@pytest.mark.parametrize("cfg", [gemv.GemvConfig(), gemv.GemvConfig(4, 128, 4, 2), gemv.GemvConfig(32, 256, 8, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_before_and_residual_after_the_one_row_product(device, n, k, bias, cfg, dtype):
    """The one-row kernel with an RMSNorm folded in front and a residual add behind (hf_rstitch.fast.patches.folds):
    F.linear(norm(x)) + residual, as the eager modules round it; each part alone too."""
    torch.manual_seed(n + k)
    norm = _rms_norm(k, dtype, device)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    x, r = torch.randn(1, 1, k, device=device).to(dtype), torch.randn(1, 1, n, device=device).to(dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.07, rtol=0.02)  # a bf16 ulp or two
    with torch.no_grad():
        linear = torch.nn.functional.linear
        torch.testing.assert_close(gemv.launch(x, w, b, cfg, norm.weight, norm.variance_epsilon, r),
                                   linear(norm(x), w, b) + r, **tol)
        torch.testing.assert_close(gemv.launch(x, w, b, cfg, norm.weight, norm.variance_epsilon),
                                   linear(norm(x), w, b), **tol)
        torch.testing.assert_close(gemv.launch(x, w, b, cfg, residual=r), linear(x, w, b) + r, **tol)
    with pytest.raises(ValueError, match="one-row kernel only"):
        gemv.launch(x.expand(1, 2, k), w, b, gemv.FEW_ROWS[0], residual=r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,cfg", [(2, gemv.GemvConfig(16, 64, 4, 2, 16)), (7, gemv.GemvConfig(32, 128, 4, 2, 16)),
                                      (16, gemv.GemvConfig(16, 64, 4, 2, 16)), (16, gemv.GemvConfig(32, 128, 4, 2, 16)),
                                      (17, gemv.WIDE[0]), (64, gemv.WIDE[7]),
                                      # the reduction in splits (the last one shorter), then their sum (+ bias)
                                      (5, gemv.GemvConfig(32, 64, 4, 2, 16, 2)), (16, gemv.GemvConfig(16, 32, 4, 2, 16, 4)),
                                      (40, gemv.GemvConfig(64, 64, 4, 3, 64, 3))])
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (37, 130, False), (300, 520, True)])
def test_few_rows_kernel_equals_linear(device, rows, n, k, bias, cfg):
    torch.manual_seed(rows + n)
    w = torch.randn(n, k, device=device)
    b = torch.randn(n, device=device) if bias else None
    x = torch.randn(1, rows, k, device=device)
    y = gemv.launch(x, w, b, cfg)
    assert y.shape == (1, rows, n)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-4)
    w16, x16 = w.bfloat16(), x.bfloat16()  # bf16 in, fp32 accumulation, one rounding at the end
    b16 = b.bfloat16() if bias else None
    want = torch.nn.functional.linear(x16.float(), w16.float(), b16.float() if bias else None)
    torch.testing.assert_close(gemv.launch(x16, w16, b16, cfg).float(), want, atol=0.1, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_gemv_refuses_too_many_rows(device):
    with pytest.raises(ValueError, match="1..1 row"):
        gemv.launch(torch.randn(2, 8, device=device), torch.randn(4, 8, device=device), None, gemv.GemvConfig())
    with pytest.raises(ValueError, match="1..16 row"):
        gemv.launch(torch.randn(17, 8, device=device), torch.randn(4, 8, device=device), None,
                    gemv.GemvConfig(block_m=16))


def _each_model(test):
    """Every device, both architectures, q/k/v fused and not."""
    for mark in (pytest.mark.parametrize("device", DEVICES), pytest.mark.parametrize("fuse", [False, True]),
                 pytest.mark.parametrize("arch", ["llama", "qwen2"])):
        test = mark(test)
    return test


@_each_model
def test_linears_on_model_equal_and_restored(device, fuse, arch):
    model = kernel_model(device, arch)
    table = linears.tune_model(model)
    assert len(table) == 2 * len({gemv.shape_key(m.weight, m.bias) for m in linears.linear_modules(model)})  # 1, few rows
    patches = linears.plan(model, table, fuse=fuse)
    assert len(patches) == len(linears.linear_modules(model))  # every layer, fused or alone
    one = torch.randint(0, 97, (1, 1), device=device)
    several = torch.randint(0, 97, (1, 5), device=device)
    many = torch.randint(0, 97, (1, gemv.MAX_ROWS + 3), device=device)
    with torch.no_grad():
        want = [model(ids).logits for ids in (one, several, many)]
        with linears.gemv_linears_on(patches):
            assert all("forward" in m.__dict__ for m in linears.linear_modules(model))
            got = [model(ids).logits for ids in (one, several, many)]
    assert not any("forward" in m.__dict__ for m in linears.linear_modules(model))  # restored
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[2], want[2])  # more than MAX_ROWS rows keep F.linear


def test_tiers_by_rows():
    assert [gemv.tier(n) for n in (1, 2, gemv.MAX_ROWS, gemv.MAX_ROWS + 1, gemv.WIDE_ROWS, gemv.WIDE_ROWS + 1)] == \
        [0, 1, 1, 2, 2, None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse", [False, True])
def test_a_lane_of_64_rows_runs_the_wide_tier(device, fuse):
    """Tuned for 64 rows, inputs of 17..64 rows run the wide tier (its own configuration per shape); more rows
    keep F.linear."""
    model = kernel_model(device, "llama")
    table = linears.tune_model(model, max_rows=gemv.WIDE_ROWS)
    assert len(table) == 3 * len({gemv.shape_key(m.weight, m.bias) for m in linears.linear_modules(model)})
    patches = linears.plan(model, table, fuse=fuse, max_rows=gemv.WIDE_ROWS)
    assert_wide_tier_runs(model, patches, device)


@_each_model
def test_linears_compile_through_custom_op(device, fuse, arch):
    model = kernel_model(device, arch)
    assert_compiles_like_eager(model, linears.plan(model, {}, fuse=fuse), device)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_skips_what_the_kernel_cannot_read(device):
    model = kernel_model(device, "llama")
    layer = model.model.layers[0].mlp.down_proj
    layer.weight = torch.nn.Parameter(layer.weight.detach().t().contiguous().t())  # columns contiguous
    model.model.layers[1].mlp.up_proj.double()  # float64: the kernel accumulates in float32
    kept = {id(m) for m, _ in linears.plan(model, {})}
    assert id(layer) not in kept and id(model.model.layers[1].mlp.up_proj) not in kept
    assert len(kept) == 2 * 7 + 1 - 2  # 7 linear layers a block, 2 blocks, the LM head; 2 left alone

