"""MoE feed-forwards on the fast engine equal the eager engine: Qwen3-MoE, Mixtral and gpt-oss tiny pairs
(an MoE LLM with a dense or MoE SLM), B = 1 and B = 3 left-padded, replayed routes and thresholds, with the
experts dispatched on the device (``hf_rstitch.fast.patches.experts``) while the eager engine runs transformers'
default dispatch. On CUDA the lanes capture graphs (the eager dispatch's host loop could not be captured).
"""

import pytest
import torch
from transformers import (GptOssConfig, GptOssForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.integrations import moe

from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import FastConfig, FastEngine, check_supported
from hf_rstitch.fast.kernels import expert_gemv
from hf_rstitch.fast.patches import experts as fast_experts
from engine_checks import assert_same, generate_n
from tiny_models import SPECIAL, left_pad, prompt

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
N_NEW = 16
ROUTES = [["slm"] * 3 + ["llm"] * 6 + ["slm"] * 7, ["llm", "slm"] * 8, ["slm"] * 10 + ["llm"] * 6]


def _shape(hidden, layers, heads):
    return dict(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=16,
                max_position_embeddings=256, initializer_range=0.35, **SPECIAL)


def _build(arch, hidden, layers, heads, seed, dtype, device):
    torch.manual_seed(seed)
    shape = _shape(hidden, layers, heads)
    if arch == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**shape, num_experts=6, num_experts_per_tok=2,
                                                   moe_intermediate_size=hidden, norm_topk_prob=True))
    elif arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**shape, num_local_experts=4, num_experts_per_tok=2))
    elif arch == "gpt_oss":
        config = GptOssConfig(**shape, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)
        config.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        model = GptOssForCausalLM(config)
    else:  # a dense SLM for an MoE LLM (Qwen3-30B-A3B with Qwen3-0.6B)
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.update(**SPECIAL)
    return model


PAIRS = {"qwen3_moe": ("qwen3_moe", "qwen3"), "mixtral": ("mixtral", "mixtral"), "gpt_oss": ("gpt_oss", "gpt_oss")}




@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", list(PAIRS))
@pytest.mark.parametrize("dispatch", [None, expert_gemv.NAME])
def test_moe_pairs_equal_the_eager_engine(arch, device, dispatch, monkeypatch):
    """``dispatch``: FastConfig.experts (None: the default; rstitch_gemv: the decode kernels, on CPU under
    TRITON_INTERPRET=1 only; gpt-oss's layout runs their fallback)."""
    if dispatch == expert_gemv.NAME and not expert_gemv.available(device):
        pytest.skip("the experts kernels need triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
    dispatched = []
    if dispatch == expert_gemv.NAME and arch != "gpt_oss":
        kernel = expert_gemv.gate_up
        monkeypatch.setattr(expert_gemv, "gate_up", lambda *a, **k: dispatched.append(1) or kernel(*a, **k))
    else:
        batched = moe.ALL_EXPERTS_FUNCTIONS["batched_mm"]
        monkeypatch.setitem(moe.ALL_EXPERTS_FUNCTIONS._global_mapping, "batched_mm",
                            lambda *a, **k: dispatched.append(1) or batched(*a, **k))
    llm_arch, slm_arch = PAIRS[arch]
    llm = _build(llm_arch, 64, 3, 4, 0, torch.float32, device)
    slm = _build(slm_arch, 32, 2, 2, 1000, torch.float32, device)
    before = llm.config._experts_implementation
    check_supported(llm)
    one = prompt(11).to(device)
    ids, mask = (t.to(device) for t in left_pad([prompt(k, seed=20 + i) for i, k in enumerate([7, 13, 4])]))
    cpu = dict(attention="matmul", gemv=False, fuse_mlp=False, fuse_rope_store=False) if device == "cpu" else {}
    engine = FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda", experts=dispatch, **cpu), max_batch=3)
    for batch_ids, batch_mask, routes in ((one, torch.ones_like(one), ROUTES[:1]), (ids, mask, ROUTES)):
        try:
            ref = generate_n(llm, slm, batch_ids, batch_mask, "default", N_NEW, stitch_policy=ReplayPolicy(routes))
        except RuntimeError as err:  # e.g. transformers' own experts kernels in a dtype this GPU lacks
            pytest.skip(f"the eager engine itself fails here, nothing to compare: {err}"[:300])
        out = generate_n(llm, slm, batch_ids, batch_mask, engine, N_NEW, stitch_policy=ReplayPolicy(routes))
        assert_same(out, ref, 2e-4)
    seen = sorted(h for t in ref.stitch for h in t.slm_entropies if h is not None)
    tau = seen[len(seen) // 2]  # the median SLM entropy: routes mix
    ref = generate_n(llm, slm, ids, mask, "default", N_NEW, stitch_threshold=tau)
    assert_same(generate_n(llm, slm, ids, mask, engine, N_NEW, stitch_threshold=tau), ref, 2e-4)
    assert any(len(set(t.roles)) > 1 for t in ref.stitch)
    if device == "cpu":
        assert dispatched  # the lanes' forwards ran the on-device dispatch
    assert llm.config._experts_implementation == before  # the lanes set their dispatch only while they run


def test_the_dispatch_is_chosen_per_dtype_and_device():
    llm = _build("qwen3_moe", 32, 1, 2, 0, torch.float32, "cpu")
    assert fast_experts.implementation(llm) == "batched_mm"
    assert fast_experts.implementation(_build("qwen3", 32, 1, 2, 0, torch.float32, "cpu")) is None
    plan = fast_experts.plan(llm)
    before = llm.config._experts_implementation
    with fast_experts.experts_on(plan):
        assert llm.config._experts_implementation == "batched_mm"
    assert llm.config._experts_implementation == before


def test_experts_outside_the_interface_are_refused():
    model = _build("qwen3_moe", 32, 1, 2, 0, torch.float32, "cpu")
    for m in model.modules():
        if hasattr(m, "has_gate"):
            del m.has_gate  # as a model whose experts loop on the host
    assert "experts interface" in fast_experts.why_not(model)
    with pytest.raises(ValueError, match="experts interface"):
        check_supported(model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_bf16_experts_are_captured_and_replay_what_they_run_eagerly():
    """bfloat16 on the GPU (the decode kernels, expert_gemv, by default on CUDA): the experts' dispatch is captured
    with the step (no host read of the routing), and the graphs' tokens equal the same lanes' run without graphs."""
    llm = _build("qwen3_moe", 64, 3, 4, 0, torch.bfloat16, "cuda")
    slm = _build("qwen3", 32, 2, 2, 1000, torch.bfloat16, "cuda")
    assert fast_experts.implementation(llm) == expert_gemv.NAME
    ids, mask = (t.cuda() for t in left_pad([prompt(k, seed=20 + i) for i, k in enumerate([7, 13, 4])]))
    outs = [generate_n(llm, slm, ids, mask, FastEngine(FastConfig(max_bucket=4, graphs=graphs), max_batch=3), N_NEW,
                       stitch_policy=ReplayPolicy(ROUTES)) for graphs in (True, False)]
    assert torch.equal(outs[0].sequences, outs[1].sequences)


@pytest.mark.skipif(not expert_gemv.available("cpu"), reason="the Triton norms and router kernels: TRITON_INTERPRET=1")
def test_moe_layers_get_the_dense_layers_kernels_under_compile_parts(monkeypatch):
    """``compile="parts"`` (AUTO's) on a Qwen3-MoE LLM: its layers' norms run the Triton norm kernels, each residual
    add with the norm after it as one piece, q / k norms in the rotation kernel, the routers as their kernels, the
    experts by the decode kernels -- and the pair (B = 3 left-padded) equals the eager engine."""
    from hf_rstitch.fast.kernels import moe_router, norms
    from hf_rstitch.fast.plan import plan_for

    llm = _build("qwen3_moe", 64, 2, 4, 0, torch.float32, "cpu")
    slm = _build("qwen3", 32, 2, 2, 1000, torch.float32, "cpu")
    config = FastConfig(max_bucket=4, graphs=False, compile="parts", experts=expert_gemv.NAME)
    plan = plan_for(llm, config, max_rows=3)
    assert plan.add_norm and plan.rope_store and plan.fuse_router and plan.experts == expert_gemv.NAME
    ids, mask = left_pad([prompt(k, seed=20 + i) for i, k in enumerate([7, 13, 4])])
    ref = generate_n(llm, slm, ids, mask, "default", N_NEW, stitch_policy=ReplayPolicy(ROUTES))
    ran = {"norm_forward": 0, "add_norm_piece": 0, "route": 0}
    for module, name in ((norms, "norm_forward"), (norms, "add_norm_piece"), (moe_router, "route")):
        fn = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, fn=fn, name=name, **k: ran.__setitem__(name, ran[name] + 1)
                            or fn(*a, **k))
    out = generate_n(llm, slm, ids, mask, FastEngine(config, max_batch=3), N_NEW, stitch_policy=ReplayPolicy(ROUTES))
    assert_same(out, ref, 2e-4)
    assert all(ran.values()), ran
