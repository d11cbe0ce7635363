"""The router kernels (hf_rstitch.fast.kernels.moe_router) against the eager routers of Qwen3-MoE (with and without
``norm_topk_prob``) and Mixtral: logits, weights (value and dtype) and ids for 1 and 3 rows, float32 (bfloat16 on
CUDA too); the routers whose form they do not cover keep their code.

On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``); these tests skip otherwise.
"""

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from hf_rstitch.fast.kernels import moe_router
from hf_rstitch.fast.patches import experts as fast_experts
from hf_rstitch.fast.patches import routers

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", moe_router.available("cpu")), ("cuda", CUDA and moe_router.available("cuda")))
           if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
# hidden 200 and 37 experts: neither a multiple of the kernels' blocks
SHAPE = dict(vocab_size=64, hidden_size=200, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12, initializer_range=0.3)


def _model(arch, device, dtype, norm=True):
    torch.manual_seed(0)
    if arch == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SHAPE, num_experts=37, num_experts_per_tok=6,
                                                   moe_intermediate_size=24, norm_topk_prob=norm))
    else:
        model = MixtralForCausalLM(MixtralConfig(**SHAPE, num_local_experts=37, num_experts_per_tok=6))
    return model.to(device=device, dtype=dtype).eval()


CASES = [("qwen3_moe", True), ("qwen3_moe", False), ("mixtral", True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,norm", CASES)
@pytest.mark.parametrize("tokens", [1, 3])
def test_router_kernels_equal_the_eager_router(arch, norm, tokens, device):
    model = _model(arch, device, torch.float32, norm)
    found = routers.plan(model)
    assert len(found) == 1
    router, forward = found[0]
    assert routers.form(router) == arch
    x = torch.randn(1, tokens, SHAPE["hidden_size"], device=device)
    with torch.no_grad():
        ref, got = router(x), forward(x)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)  # logits
    assert got[1].dtype == ref[1].dtype and got[1].shape == ref[1].shape
    torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=1e-5)  # weights
    assert torch.equal(got[2], ref[2])  # ids, in topk's (descending) order


@pytest.mark.skipif(not CUDA, reason="bfloat16 rounding as cuBLAS rounds: on the GPU")
@pytest.mark.parametrize("arch,norm", CASES)
@pytest.mark.parametrize("tokens", [1, 8])
def test_router_kernels_in_bf16(arch, norm, tokens):
    model = _model(arch, "cuda", torch.bfloat16, norm)
    router, forward = routers.plan(model)[0]
    x = torch.randn(tokens, SHAPE["hidden_size"], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref, got = router(x), forward(x)
    torch.testing.assert_close(got[0], ref[0], atol=2e-2, rtol=1e-2)
    assert got[1].dtype == ref[1].dtype
    same = (got[2] == ref[2]).all(dim=-1)  # a near-tie of bf16 logits may order two experts otherwise
    assert same.float().mean() >= 0.5
    torch.testing.assert_close(got[1][same], ref[1][same], atol=1e-2, rtol=1e-2)


def test_other_routers_keep_their_code():
    model = _model("qwen3_moe", "cpu", torch.float32)
    router = model.model.layers[0].mlp.gate

    class Biased(type(router)):
        def forward(self, hidden_states):  # another form: not the reference text
            return super().forward(hidden_states + 1)

    router.__class__ = Biased
    assert routers.form(router) is None and routers.plan(model) == []


@pytest.mark.parametrize("device", DEVICES)
def test_the_lane_installs_the_routers_only_inside_the_block(device):
    model = _model("mixtral", device, torch.float32)
    router = model.model.layers[0].mlp.gate
    plan = fast_experts.plan(model)
    assert [r for r, _ in plan.routers] == [router]
    with fast_experts.experts_on(plan):
        assert "forward" in router.__dict__
    assert "forward" not in router.__dict__
    assert fast_experts.plan(model, routers=False).routers == ()
