"""The decode experts kernels (hf_rstitch.fast.kernels.expert_gemv) against the eager MoE block of Qwen3-MoE and Mixtral:
the experts' output for B = 1 and B = 3 tokens (top-2 of 4 experts, float32), the kernels' path taken, and
the fallback dispatch for more pairs than the kernels take.

On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``); these tests skip otherwise.
"""

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from hf_rstitch.fast.kernels import expert_gemv
from hf_rstitch.fast.patches import experts as fast_experts

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", expert_gemv.available("cpu")), ("cuda", CUDA and expert_gemv.available("cuda")))
           if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
SHAPE = dict(vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12, initializer_range=0.3)


def _moe_block(arch, device):
    torch.manual_seed(0)
    if arch == "qwen3_moe":  # moe_intermediate 24, hidden 48: neither a multiple of the kernels' blocks
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SHAPE, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=24, norm_topk_prob=True))
    else:
        model = MixtralForCausalLM(MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2))
    model = model.to(device).eval()
    block = model.model.layers[0].mlp
    return model, block, fast_experts.expert_modules(model)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_kernels_equal_the_eager_moe_block(arch, tokens, device, monkeypatch):
    model, block, module = _moe_block(arch, device)
    assert expert_gemv.why_not(module) is None
    x = torch.randn(1, tokens, SHAPE["hidden_size"], device=device)
    expert_gemv.register()
    ran = []
    gate_up = expert_gemv.gate_up
    monkeypatch.setattr(expert_gemv, "gate_up", lambda *a, **k: ran.append(1) or gate_up(*a, **k))
    with torch.no_grad():
        model.config._experts_implementation = "eager"
        ref = block(x)
        model.config._experts_implementation = expert_gemv.NAME
        out = block(x)
    ref, out = (r[0] if isinstance(r, tuple) else r for r in (ref, out))
    assert ran  # the kernels ran, not the fallback
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_kernels_equal_the_eager_experts_of_the_zoo_models(model_type, tokens, device, monkeypatch):
    """The zoo suite's tiny LLM of each type (tests/zoo_models.py): every MoE layer's experts, eager against
    the kernels, on its own router's choices."""
    from zoo_models import tiny_model

    model = tiny_model(model_type, 0, seed=3).to(device)
    expert_gemv.register()
    ran = []
    gate_up = expert_gemv.gate_up
    monkeypatch.setattr(expert_gemv, "gate_up", lambda *a, **k: ran.append(1) or gate_up(*a, **k))
    blocks = [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "experts")]
    assert blocks
    torch.manual_seed(tokens)
    for block in blocks:
        x = torch.randn(1, tokens, model.config.hidden_size, device=device)
        with torch.no_grad():
            model.config._experts_implementation = "eager"
            ref = block(x)
            model.config._experts_implementation = expert_gemv.NAME
            out = block(x)
        ref, out = (r[0] if isinstance(r, tuple) else r for r in (ref, out))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(ran) == len(blocks)  # the kernels ran, not the fallback


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_on_shapes_past_one_block(device):
    """Several reduction chunks and output blocks, repeated experts across rows, weights in the hidden dtype."""
    torch.manual_seed(1)
    experts, hidden, inter, tokens, top_k = 5, 300, 70, 4, 3
    x = torch.randn(tokens, hidden, device=device)
    gate_up_proj = torch.randn(experts, 2 * inter, hidden, device=device) / hidden ** 0.5
    down_proj = torch.randn(experts, hidden, inter, device=device) / inter ** 0.5
    ids = torch.tensor([[0, 4, 2], [4, 0, 1], [3, 3, 3], [2, 1, 0]], device=device)
    weights = torch.rand(tokens, top_k, device=device)
    gate, up = torch.einsum("tkoh,th->tko", gate_up_proj[ids], x).chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up
    ref = torch.einsum("tkhi,tki,tk->th", down_proj[ids], act, weights)
    for launch in (expert_gemv.Launch(16, 256), expert_gemv.Launch(8, 64), expert_gemv.Launch(32, 128)):
        a = expert_gemv.gate_up(x, gate_up_proj, ids, launch)
        torch.testing.assert_close(a, act.reshape(-1, inter), atol=1e-5, rtol=1e-5)
        for split in (False, True):
            torch.testing.assert_close(expert_gemv.down(a, down_proj, ids, weights, launch, split), ref,
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weights_dtype", [torch.bfloat16, torch.float32])
def test_bf16_kernels_round_as_the_batched_dispatch(device, weights_dtype):
    """bfloat16 experts (routing weights in bfloat16 as Qwen3-MoE's router gives them, or float32): the kernels
    against transformers' batched_mm within a few bf16 roundings of the largest output (the interpreter rounds bf16 as
numpy does, not as a GPU), fused and split down alike."""
    from transformers.integrations import moe

    _, _, module = _moe_block("qwen3_moe", device)
    module = module.to(torch.bfloat16)
    torch.manual_seed(2)
    x = torch.randn(3, SHAPE["hidden_size"], device=device).to(torch.bfloat16)
    ids = torch.tensor([[0, 3], [2, 0], [1, 1]], device=device)
    weights = torch.rand(3, 2, device=device).to(weights_dtype)
    with torch.no_grad():
        ref = moe.batched_mm_experts_forward(module, x, ids, weights).float()
        a = expert_gemv.gate_up(x, module.gate_up_proj, ids)
        for split in (False, True):
            out = expert_gemv.down(a, module.down_proj, ids, weights, expert_gemv.DOWN, split)
            assert out.dtype == torch.bfloat16
            assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 0.02, (out.float() - ref).abs().max()


def test_more_pairs_than_the_kernels_take_run_the_fused_grouped_mm(monkeypatch):
    """Past MAX_PAIRS the forward runs grouped_mm where it is fused (bfloat16 on CUDA from 9.0; made so here);
    elsewhere the kernels go on (test_kernels_past_max_pairs_where_grouped_mm_is_not_fused)."""
    model, block, module = _moe_block("qwen3_moe", "cpu")
    expert_gemv.register()
    monkeypatch.setattr(expert_gemv, "MAX_PAIRS", 3)
    monkeypatch.setattr(expert_gemv, "fused", lambda hidden_states: True)
    monkeypatch.setattr(expert_gemv, "gate_up", lambda *a, **k: pytest.fail("the kernels ran past MAX_PAIRS"))
    x = torch.randn(1, 2, SHAPE["hidden_size"])  # 4 pairs
    with torch.no_grad():
        model.config._experts_implementation = "eager"
        ref = block(x)
        model.config._experts_implementation = expert_gemv.NAME
        out = block(x)
    ref, out = (r[0] if isinstance(r, tuple) else r for r in (ref, out))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_past_max_pairs_where_grouped_mm_is_not_fused(device, monkeypatch):
    """float32: batched_mm would copy each pair's expert weights, so the kernels take every forward."""
    model, block, module = _moe_block("qwen3_moe", device)
    expert_gemv.register()
    monkeypatch.setattr(expert_gemv, "MAX_PAIRS", 3)
    ran = []
    gate_up = expert_gemv.gate_up
    monkeypatch.setattr(expert_gemv, "gate_up", lambda *a, **k: ran.append(1) or gate_up(*a, **k))
    x = torch.randn(1, 5, SHAPE["hidden_size"], device=device)  # 10 pairs
    with torch.no_grad():
        model.config._experts_implementation = "eager"
        ref = block(x)
        model.config._experts_implementation = expert_gemv.NAME
        out = block(x)
    ref, out = (r[0] if isinstance(r, tuple) else r for r in (ref, out))
    assert ran
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_layouts_the_kernels_do_not_cover_are_named():
    from transformers import GptOssConfig, GptOssForCausalLM

    model = GptOssForCausalLM(GptOssConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2))
    reason = expert_gemv.why_not(fast_experts.expert_modules(model)[0])
    assert reason is not None and "GptOss" in reason


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens", [2, 5, 20])
def test_expert_major_kernels_equal_the_pair_kernels(device, tokens):
    """Several rows run one program an expert (expert_major): the same activations and outputs as the pair
    kernels, with experts chosen by one pair, by many (past one BLOCK_M of 16) and by none; shapes past one block."""
    from hf_rstitch.fast.kernels import expert_major

    torch.manual_seed(tokens)
    experts, hidden, inter, top_k = 6, 300, 70, 3
    x = torch.randn(tokens, hidden, device=device)
    gate_up_proj = torch.randn(experts, 2 * inter, hidden, device=device) / hidden ** 0.5
    down_proj = torch.randn(experts, hidden, inter, device=device) / inter ** 0.5
    ids = torch.stack([torch.randperm(experts - 1, device=device)[:top_k] for _ in range(tokens)])  # expert 5: none
    ids[:, 0] = 2  # every row chooses expert 2: 20 rows are past one block of pairs
    weights = torch.rand(tokens, top_k, device=device)
    assert expert_gemv.by_expert(ids)
    ref_act = expert_gemv.gate_up(x, gate_up_proj, ids, expert_gemv.GATE_UP)
    act = expert_gemv.gate_up(x, gate_up_proj, ids)
    torch.testing.assert_close(act, ref_act, atol=1e-5, rtol=1e-5)
    ref = expert_gemv.down(ref_act, down_proj, ids, weights, expert_gemv.DOWN)
    torch.testing.assert_close(expert_gemv.down(act, down_proj, ids, weights), ref, atol=1e-5, rtol=1e-5)
    for launch in (expert_major.Launch(16, 16, 64, 4), expert_major.Launch(32, 64, 32, 4)):
        torch.testing.assert_close(expert_major.gate_up(x, gate_up_proj, ids, launch), ref_act, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(expert_major.down(act, down_proj, ids, weights, launch), ref, atol=1e-5, rtol=1e-5)
