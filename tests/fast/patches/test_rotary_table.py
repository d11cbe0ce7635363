"""The rotary table (hf_rstitch.fast.patches.rotary_table): the module's own cos/sin, read instead of computed."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.patches import rotary_table
from tiny_models import make_pair, prompt


def _model(arch: str, dtype=torch.float32, **rope):
    cls, cfg = (LlamaForCausalLM, LlamaConfig) if arch == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    config = cfg(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, **rope)
    return cls(config).to(dtype).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_lookup_gives_the_module_values(arch, dtype):
    model = _model(arch, dtype)
    [(module, forward)] = rotary_table.plan(model, 200)
    positions = torch.randint(0, 200, (3, 5), generator=torch.Generator().manual_seed(0))
    x = torch.zeros(3, 5, 64, dtype=dtype)
    got, want = forward(x, positions), module(x, positions)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous()
        assert rotary_table.close(g, w)  # to the last bits (CPU rounding depends on the call's shape)


def test_a_module_computing_something_else_keeps_its_forward():
    """The probe compares the table with the module at other positions, in a call of another shape."""
    model = _model("llama")
    rotary = model.model.rotary_emb
    original = type(rotary).forward

    def shape_dependent(self, x, position_ids):
        cos, sin = original(self, x, position_ids)
        return cos + 1e-3 * position_ids.shape[-1], sin

    rotary.forward = shape_dependent.__get__(rotary)
    assert rotary_table.plan(model, 200) == []


def test_rope_types_whose_frequencies_move_keep_their_forward():
    model = _model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert model.model.rotary_emb.rope_type == "dynamic"
    assert rotary_table.plan(model, 200) == []


def test_modules_of_another_signature_keep_their_forward():
    class OddRotaryEmbedding(torch.nn.Module):
        def forward(self, x, position_ids, extra):
            return x, x

    holder = torch.nn.Module()
    holder.rotary = OddRotaryEmbedding()
    holder.dtype, holder.device = torch.float32, torch.device("cpu")
    assert rotary_table.plan(holder, 16) == []


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_fast_engine_with_the_table_equals_without(arch):
    """Through generate (CPU, eager static-cache steps, float64): same tokens, logits to float64 rounding."""
    llm, slm = make_pair(arch)
    route = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 4 + ["llm"] + ["slm"] * 2
    outs = []
    for table in (True, False):
        engine = FastEngine(FastConfig(max_bucket=4, graphs=False, rotary_table=table))
        outs.append(llm.generate(prompt(12), assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                                 return_dict_in_generate=True, output_logits=True))
        lane = engine._lanes[next(iter(engine._lanes))]
        assert bool(lane._rotary_tables) == table
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
