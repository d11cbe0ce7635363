"""Fused kernels stand in for a module only where a probe on random inputs shows it equal (hf_rstitch.fast.probes),
and the plan names every module that keeps its own code, with the reason."""

import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from hf_rstitch.fast import FastConfig, plan_for, probes
from hf_rstitch.fast.kernels.norms import llama_rms_norm
from hf_rstitch.fast.patches import add_norm, folds, regions, routers
from tiny_models import make_model

PARTS = FastConfig(graphs=False, compile="parts")


class EpsOutsideRMSNorm(LlamaRMSNorm):
    """Llama's RMSNorm with the epsilon added after the square root: a one-line change."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states / (torch.sqrt(variance) + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class ScaledRMSNorm(LlamaRMSNorm):
    """Llama's RMSNorm times an extra scale."""

    def forward(self, hidden_states):
        return super().forward(hidden_states) * 1.0001


class ScaledResidualDecoderLayer(LlamaDecoderLayer):
    """Llama's decoder layer whose MLP output is scaled: its last line changed."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, cache=cache, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + 2 * hidden_states


def _retyped(model, cls, new):
    for m in model.modules():
        if type(m) is cls:
            m.__class__ = new
    return model


def _modules(plan):
    return {(c.part, c.module): c for c in plan.modules}


def test_llamas_own_modules_probe_equal_and_are_named_with_their_kernels():
    plan = plan_for(make_model("llama", 32, 2, 0), PARTS)
    lines = _modules(plan)
    norm, layer = lines["norm", "LlamaRMSNorm"], lines["layer", "LlamaDecoderLayer"]
    assert (norm.count, layer.count) == (5, 2)  # two a layer and the final norm; two layers
    assert norm.why.endswith("probe equal (max abs err 0)")  # float64: bit-equal
    assert layer.kernel == "add + norm pieces" and layer.why == "probe equal (max abs err 0)"


def test_a_norm_that_differs_by_a_line_runs_its_own_code_and_says_why():
    for cls in (EpsOutsideRMSNorm, ScaledRMSNorm):
        model = _retyped(make_model("llama", 32, 2, 0), LlamaRMSNorm, cls)
        line = _modules(plan_for(model, PARTS))["norm", cls.__name__]
        assert line.kernel is None and line.count == 5
        assert line.why.startswith("probe differs (max abs err ")
        assert f"{cls.__name__} x5 (norm): model's own code: probe differs (max abs err " in str(plan_for(model, PARTS))
        assert not llama_rms_norm(model.model.norm)  # what the patches read: no kernel installed for it
        assert probes.rms_norm(model.model.norm).err > 0


def test_the_epsilon_shows_in_half_precision_too():
    norm = EpsOutsideRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    assert not probes.rms_norm(norm).same  # rows of the epsilon's scale
    assert probes.rms_norm(LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)).same


def test_a_layer_that_differs_by_a_line_keeps_its_forward():
    model = _retyped(make_model("llama", 32, 2, 0), LlamaDecoderLayer, ScaledResidualDecoderLayer)
    line = _modules(plan_for(model, PARTS))["layer", "ScaledResidualDecoderLayer"]
    assert line.kernel is None and line.why.startswith("probe differs (max abs err ")
    assert not add_norm.pre_norm_layer(model.model.layers[0])
    assert add_norm.plan(model, lambda key, fn: fn) == []


def test_probes_leave_the_model_untouched():
    model = make_model("llama", 32, 2, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layer = model.model.layers[0]
    parts = dict(layer._modules)
    assert add_norm.verdict(layer).same and folds.plain_attention(layer.self_attn).same
    assert dict(layer._modules) == parts
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert plan_for(model, PARTS) == plan_for(model, PARTS)  # seeded: the same plan twice


def test_routers_probe_their_form():
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    assert routers.verdict(router)[0] == "qwen3_moe"

    class Biased(Qwen3MoeTopKRouter):
        def forward(self, hidden_states):
            return super().forward(hidden_states + 1)

    router.__class__ = Biased
    form, verdict = routers.verdict(router)
    assert form is None and verdict.why.startswith("probe differs")


def test_norm_candidates_are_what_compile_parts_compiles():
    model = make_model("qwen2", 32, 2, 0)
    forwards, _ = regions.plan(model)
    norms = [m for m, _ in forwards if regions.norm_candidate(m)]
    assert len(norms) == _modules(plan_for(model, PARTS))["norm", "Qwen2RMSNorm"].count == 5


class FlippedUnitsDecoderLayer(LlamaDecoderLayer):
    """Llama's decoder layer whose attention reads its normed input with the hidden units reversed (and writes them
    back reversed): the same sums in another place."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states).flip(-1)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, cache=cache, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states.flip(-1)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.mlp(hidden_states)


def test_a_layer_that_moves_hidden_units_keeps_its_forward():
    model = _retyped(make_model("llama", 32, 2, 0), LlamaDecoderLayer, FlippedUnitsDecoderLayer)
    assert add_norm.verdict(model.model.layers[0]).why.startswith("probe differs (max abs err ")


def test_a_layer_probe_draws_values_in_proportion_to_the_width():
    """A 7B layer's probe draws O(d) random values (it drew four d x d matrices, a minute on a 7B/1.5B pair)."""
    d = 3584
    parts = add_norm._stand_ins(d, torch.empty(0, dtype=torch.bfloat16))
    drawn = sum(t.numel() for p in parts.values() for t in (p.w, *(p.mix or ())))
    assert drawn <= 4 * d * (add_norm.RANK + 1)  # two norms, two parts of a diagonal and two rank-RANK factors


def test_a_llama_layer_probes_equal_in_bfloat16():
    layer = make_model("llama", 32, 2, 0).to(torch.bfloat16).model.layers[0]
    assert add_norm.verdict(layer).same
