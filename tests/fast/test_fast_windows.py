"""Sliding-window and hybrid attention on the fast engine's static cache equal the eager engine.

Tiny random pairs of every windowed family transformers ships in the shapes users bring: Mistral
(``sliding_window`` on every layer, no ``layer_types``), Qwen2 (``use_sliding_window`` with
``max_window_layers``), Gemma 2 (hybrid, soft-capped scores), Gemma 3 (hybrid, its own scaling and local
rotary base), OLMo 3 (hybrid) and gpt-oss (hybrid, attention sinks, MoE). Windows of 5-6 tokens, prompts
of up to 19 and 20 new tokens, catch-ups of up to 4 (``max_bucket=4``): every layer's window is passed
many times, by decode steps and catch-ups. B = 1 and B = 3 left-padded, replayed routes and thresholds.

On CPU the matmul attention (a mask a layer); on CUDA the split Triton kernel (float32; its windows, softcap
and sinks against a reference: test_decode_attention.py), in captured graphs.
"""

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig,
                          GptOssForCausalLM, MistralConfig, MistralForCausalLM, Olmo3Config, Olmo3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.windows import layer_windows, supports_windows
from engine_checks import assert_same, generate_n
from tiny_models import SPECIAL, left_pad, prompt

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
N_NEW = 20


def _shape(hidden, layers, heads):
    return dict(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=16,
                max_position_embeddings=256, **SPECIAL)


BUILDERS = {  # arch -> (config class, model class, extra config fields, initializer range)
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=5), 0.35),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=6, max_window_layers=1), 0.35),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(sliding_window=5, attn_logit_softcapping=2.0,
                                                     final_logit_softcapping=None), 0.05),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, dict(sliding_window=5, sliding_window_pattern=2), 0.05),
    "olmo3": (Olmo3Config, Olmo3ForCausalLM, dict(sliding_window=5), 0.35),
    "gpt_oss": (GptOssConfig, GptOssForCausalLM, dict(sliding_window=5, num_local_experts=4, num_experts_per_tok=2,
                                                      layer_types=None), 0.35),
}


def make_windowed(arch, hidden, layers, heads, seed, dtype, device):
    config_class, model_class, extra, init = BUILDERS[arch]
    torch.manual_seed(seed)
    config = config_class(**_shape(hidden, layers, heads), initializer_range=init, **extra)
    if arch == "gpt_oss":  # alternate sliding and full layers, as gpt-oss ships
        config.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    model = model_class(config).to(device=device, dtype=dtype).eval()
    model.generation_config.update(**SPECIAL)
    return model


def _pair(arch, dtype, device):
    return (make_windowed(arch, 64, 3, 4, 0, dtype, device), make_windowed(arch, 32, 2, 2, 1000, dtype, device))


ROUTES = [["slm"] * 3 + ["llm"] * 9 + ["slm"] * 8,  # an LLM run longer than the window, a catch-up past it
          ["llm", "slm"] * 10,
          ["slm"] * 12 + ["llm"] * 3 + ["slm"] * 5]




def _engine(device):
    """On CPU the matmul attention and PyTorch's products, even under Triton's interpreter (which would take tens
    of minutes here; test_decode_attention.py runs the split kernel's windows there)."""
    cpu = dict(attention="matmul", gemv=False, fuse_mlp=False, fuse_rope_store=False) if device == "cpu" else {}
    return FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda", **cpu), max_batch=3)


def test_every_family_gets_the_windows_its_eager_masks_have():
    def windows(arch):
        return layer_windows(make_windowed(arch, 32, 4, 2, 0, torch.float32, "cpu").config)

    assert windows("mistral") == [5] * 4  # no layer_types: every layer, as MistralModel's mask
    assert windows("qwen2") == [None, 6, 6, 6]  # max_window_layers=1: the first layer is full
    assert windows("gemma2") == [5, None, 5, None]
    assert windows("gemma3") == [5, None, 5, None]
    assert windows("olmo3") == [5, 5, 5, None]
    assert windows("gpt_oss") == [5, None, 5, None]
    assert all(supports_windows(make_windowed(a, 32, 2, 2, 0, torch.float32, "cpu")) for a in BUILDERS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arch", list(BUILDERS))
def test_windowed_pairs_equal_the_eager_engine(arch, dtype, device):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("float64 on CUDA: the CPU run covers the matmul attention")
    if arch == "gpt_oss" and dtype == torch.float64:
        pytest.skip("gpt-oss's eager experts (torch._grouped_mm) take no float64")
    if arch == "gemma2" and dtype == torch.float64:
        pytest.skip("transformers' own Gemma 2 forward gives NaN on left-padded rows in float64 (float32 does not)")
    llm, slm = _pair(arch, dtype, device)
    # Gemma's eager attention takes its softmax in float32 even for a float64 model; the static attentions in the
    # model's dtype: logits agree to float32 rounding there
    tol = 2e-4 if dtype == torch.float32 else 1e-5 if arch.startswith("gemma") else 1e-9
    one = prompt(19).to(device)
    ids, mask = (t.to(device) for t in left_pad([prompt(k, seed=20 + i) for i, k in enumerate([7, 13, 4])]))
    for batch_ids, batch_mask, routes in ((one, torch.ones_like(one), ROUTES[:1]), (ids, mask, ROUTES)):
        try:
            ref = generate_n(llm, slm, batch_ids, batch_mask, "default", N_NEW, stitch_policy=ReplayPolicy(routes))
        except RuntimeError as err:  # e.g. transformers' own experts kernels in a dtype this GPU lacks
            pytest.skip(f"the eager engine itself fails here, nothing to compare: {err}"[:300])
        out = generate_n(llm, slm, batch_ids, batch_mask, _engine(device), N_NEW, stitch_policy=ReplayPolicy(routes))
        assert_same(out, ref, tol)
    # entropy routing at the median of the SLM's entropies on the replayed routes: the routes themselves must agree
    seen = sorted(h for t in ref.stitch for h in t.slm_entropies if h is not None)
    tau = seen[len(seen) // 2]
    ref = generate_n(llm, slm, ids, mask, "default", N_NEW, stitch_threshold=tau)
    assert_same(generate_n(llm, slm, ids, mask, _engine(device), N_NEW, stitch_threshold=tau), ref, tol)
    assert any(len(set(t.roles)) > 1 for t in ref.stitch)  # some row switched models


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["gemma2", "gpt_oss"])
def test_split_kernel_lanes_equal_matmul_lanes(arch):
    """The split kernel inside the lanes (its steps build no mask: windows, softcap and sinks are the kernel's) gives
    the matmul attention's outputs; on CPU under Triton's interpreter (TRITON_INTERPRET=1), else on CUDA."""
    from hf_rstitch.fast.kernels import triton_support

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not triton_support.available(device):
        pytest.skip("needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
    llm, slm = _pair(arch, torch.float32, device)
    ids, mask = (t.to(device) for t in left_pad([prompt(9, seed=1), prompt(4, seed=2)]))
    route = [["slm"] * 2 + ["llm"] * 5 + ["slm"] * 3] * 2
    outs = []
    for attention in ("split", "matmul"):
        config = FastConfig(max_bucket=4, graphs=device == "cuda", attention=attention, gemv=False, fuse_mlp=False,
                            fuse_rope_store=False)
        engine = FastEngine(config, max_batch=2)
        outs.append(llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=10, min_new_tokens=10,
                                 return_dict_in_generate=True, output_logits=True))
        assert (next(iter(engine._lanes.values()))._no_mask is not None) == (attention == "split")
    assert_same(outs[0], outs[1], 1e-4)


def test_a_windowed_layer_that_passes_no_window_is_refused():
    """A config with a window whose layers pass no ``sliding_window`` to their attention (Moshi's: its model builds
    a full mask anyway): the fast engine cannot tell which applies (the shape probe makes this a refusal before a
    lane is built: tests/zoo)."""
    from hf_rstitch.fast.windows import call_window

    class Layer:
        layer_idx = 0

    with pytest.raises(ValueError, match="passes no sliding_window"):
        call_window(Layer(), {}, [5])
    assert call_window(Layer(), {}, [None]) is None
    assert call_window(Layer(), {"sliding_window": 5}, [5]) == 5
