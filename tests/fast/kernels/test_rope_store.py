"""The rotary and cache-store kernels (hf_rstitch.fast.kernels.rope_store) against the code they replace.

Like test_gemv: on CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``);
these tests skip when it is not there. On CUDA they run compiled.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

from hf_rstitch.fast.kernels import gemv, rope_store

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")), ("cuda", CUDA and gemv.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


def _heads(b, s, device, dim=16, hq=4, hk=2):
    """q, k, v as an attention layer sees them: transposed views of one fused projection output."""
    torch.manual_seed(0)
    fused = torch.randn(b, s, (hq + 2 * hk) * dim, device=device)
    q, k, v = fused.split([hq * dim, hk * dim, hk * dim], dim=-1)
    return [t.view(b, s, -1, dim).transpose(1, 2) for t in (q, k, v)]


def _tables(b, s, device, dim=16):
    angle = torch.randn(b, s, dim // 2, device=device)
    return [torch.cat([f(angle), f(angle)], dim=-1) for f in (torch.cos, torch.sin)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,dim", [(1, 1, 16), (2, 3, 16), (3, 1, 24)])
@pytest.mark.parametrize("fn", [modeling_qwen2.apply_rotary_pos_emb, modeling_llama.apply_rotary_pos_emb])
def test_rotate_qk_equals_apply_rotary_pos_emb(device, b, s, dim, fn):
    q, k, _ = _heads(b, s, device, dim)
    cos, sin = _tables(b, s, device, dim)
    got = rope_store.rotate_qk(q, k, cos, sin)
    want = fn(q, k, cos, sin)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,rows", [(1, 1, 1), (2, 3, 4)])
def test_store_kv_equals_index_copy(device, b, s, rows):
    _, k, v = _heads(b, s, device)
    keys, values = (torch.randn(rows, 2, 12, 16, device=device) for _ in range(2))
    slots = torch.tensor([5, 6, 7][:s], device=device)
    want_k, want_v = keys.clone(), values.clone()
    want_k[:b].index_copy_(2, slots, k)
    want_v[:b].index_copy_(2, slots, v)
    rope_store.store_kv(k, v, slots, keys[:b], values[:b])
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,rows", [(1, 1, 1), (2, 3, 4)])
def test_rope_store_equals_rotate_then_store(device, b, s, rows):
    """The one-launch kernel writes the same bytes as the rotation kernel followed by the store kernel."""
    q, k, v = _heads(b, s, device)
    cos, sin = _tables(b, s, device)
    keys, values = (torch.randn(rows, 2, 12, 16, device=device) for _ in range(2))
    slots = torch.tensor([5, 6, 7][:s], device=device)
    want_k, want_v = keys.clone(), values.clone()
    want_q, k_rot = rope_store.rotate_qk(q, k, cos, sin)
    rope_store.store_kv(k_rot, v, slots, want_k[:b], want_v[:b])
    q_out = torch.empty(q.shape, device=device)
    rope_store.rope_store(q, k, v, cos, sin, slots, q_out, keys[:b], values[:b])
    assert torch.equal(q_out, want_q) and torch.equal(keys, want_k) and torch.equal(values, want_v)


@pytest.mark.parametrize("device", DEVICES)
def test_deferred_rotation_is_completed_by_the_cache_or_refused(device):
    """Inside deferring(cache) the rotary function hands q and k to the cache's update (one kernel); a layer
    that stores other keys than it rotated is refused, not computed wrong."""
    from hf_rstitch.fast.static_kv import StaticKV

    config = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    cache = StaticKV(config, 12, torch.float32, torch.device(device), rows=2)
    cache.slots = torch.tensor([5, 6, 7], device=device)
    q, k, v = _heads(2, 3, device)
    cos, sin = _tables(2, 3, device)
    rotary = rope_store._rotary(modeling_qwen2.apply_rotary_pos_emb)
    want_q, want_k = modeling_qwen2.apply_rotary_pos_emb(q, k, cos, sin)
    with rope_store.deferring(cache):
        q_out, k_same = rotary(q, k, cos, sin)
        assert k_same is k and cache.pending is not None
        keys, values = cache.update(k, v, 0)
    assert cache.pending is None
    torch.testing.assert_close(q_out, want_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(keys[:, :, 5:8], want_k, atol=1e-6, rtol=1e-6)
    assert torch.equal(values[:, :, 5:8], v)
    with rope_store.deferring(cache):
        rotary(q, k, cos, sin)
        with pytest.raises(RuntimeError, match="fuse_rope_store=False"):
            cache.update(k.clone(), v, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_falls_back_for_shapes_it_does_not_take(device):
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return q, k

    rotary = rope_store._rotary(original)
    q, k, _ = _heads(1, 2, device)
    cos, sin = _tables(1, 2, device)
    rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)  # [b, s, H, D] layout
    rotary(q, k, cos[..., :8], sin[..., :8])  # partial rotary
    assert calls == [2, 1]
    rotary(q, k, cos, sin)
    assert calls == [2, 1]  # the kernel took it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_plan_swaps_standard_rotary_only(device, arch, monkeypatch):
    config, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    model = model_cls(config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2)).to(device).eval()
    module = modeling_llama if arch == "llama" else modeling_qwen2
    assert [(m, name) for m, name, _ in rope_store.plan(model)] == [(module, "apply_rotary_pos_emb")]

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # pairs (0, 1), (2, 3), ...: not rotate_half
        def rot(x):
            pair = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
            return x * cos.unsqueeze(unsqueeze_dim) + pair * sin.unsqueeze(unsqueeze_dim)
        return rot(q), rot(k)

    monkeypatch.setattr(module, "apply_rotary_pos_emb", interleaved)
    assert rope_store.plan(model) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
@pytest.mark.parametrize("defer", [False, True])
def test_fast_engine_with_fused_kernels_equals_without(device, arch, defer, monkeypatch):
    """float32 pair through generate: the fused kernels (rotary, cache store, gated MLP; with ``defer`` the
    rotation and the store as one kernel) on and off give the same tokens and logits to float32 rounding
    (the float64 lane tests do not run these kernels)."""
    monkeypatch.setattr(rope_store, "DEFER", defer)
    launched = []
    original = rope_store.rope_store
    monkeypatch.setattr(torch.ops.hf_rstitch, "rope_store",
                        lambda *a: launched.append(1) or original(*a), raising=False)
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine
    from tiny_models import make_pair, prompt

    llm, slm = (m.float().to(device) for m in make_pair(arch))
    route = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 4 + ["llm"] + ["slm"] * 2
    graphs = device == "cuda"
    outs = []
    for fused in (True, False):
        config = FastConfig(max_bucket=4, graphs=graphs, fuse_mlp=fused, fuse_rope_store=fused)
        engine = FastEngine(config)
        outs.append(llm.generate(prompt(12).to(device), assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                                 return_dict_in_generate=True, output_logits=True))
        lane = engine._lanes[next(iter(engine._lanes))]
        assert bool(lane._rotary) == fused and lane.cache.fused_store == fused
        assert any(type(m).__name__.endswith("MLP") for m, _ in lane.gemv_layers) == fused
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert bool(launched) == defer
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_keeps_the_model_rotary_where_the_kernel_fails(device, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(rope_store, "rotate_qk", broken)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2)).to(device).eval()
    with pytest.warns(UserWarning, match="fused rotary kernel failed"):
        assert rope_store.plan(model) == []



def _scales_q(rotary):  # like Ministral 3's attention: q is read (scaled) between the rotation and the store
    def scaled(*args, **kwargs):
        q, k = rotary(*args, **kwargs)
        return q * 1.5, k
    return scaled


def _renorms_k(rotary):  # like HunYuan's: k changed after the rotation, so the cache stores other keys
    def renormed(*args, **kwargs):
        q, k = rotary(*args, **kwargs)
        return q, k * 1.5
    return renormed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("change", [None, _scales_q, _renorms_k])
def test_lane_defers_only_where_the_model_allows(device, change, monkeypatch):
    """A lane puts the rotation off to the store only for a model whose layers read q after the store and
    store the keys they rotated (checked once a model, on a forward with q left as NaN); the others keep
    the two kernels: the same tokens and logits as with the deferral switched off."""
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine
    from tiny_models import make_pair, prompt

    if change is not None:
        original = rope_store._rotary
        monkeypatch.setattr(rope_store, "_rotary", lambda fn: change(original(fn)))
    llm, slm = (m.float().to(device) for m in make_pair("qwen2-full"))
    route = ["slm"] * 2 + ["llm"] * 2 + ["slm"] * 3
    outs, defers = [], []
    for defer in (True, False):
        monkeypatch.setattr(rope_store, "DEFER", defer)
        engine = FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda"))
        outs.append(llm.generate(prompt(10).to(device), assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                                 return_dict_in_generate=True, output_logits=True))
        defers.append({lane._defer for lane in engine._lanes.values()})
    assert defers == [{change is None}, {False}]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s", [(1, 1), (2, 3)])
def test_rope_store_with_norms_equals_norm_then_rotate_then_store(device, b, s):
    """Per-head q/k RMSNorms (Qwen3's) in the same launch: the bytes of the eager norm, then the rotation and store."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    q, k, v = _heads(b, s, device)
    cos, sin = _tables(b, s, device)
    q_norm, k_norm = Qwen3RMSNorm(16, eps=1e-6).to(device), Qwen3RMSNorm(16, eps=1e-6).to(device)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5), k_norm.weight.uniform_(0.5, 1.5)
    keys, values = (torch.randn(4, 2, 12, 16, device=device) for _ in range(2))
    slots = torch.tensor([5, 6, 7][:s], device=device)
    want_k, want_v = keys.clone(), values.clone()
    with torch.no_grad():
        want_q, k_rot = rope_store.rotate_qk(q_norm(q), k_norm(k), cos, sin)
        rope_store.store_kv(k_rot, v, slots, want_k[:b], want_v[:b])
        q_out = torch.empty(q.shape, device=device)
        rope_store.rope_store(q, k, v, cos, sin, slots, q_out, keys[:b], values[:b], q_norm=q_norm.weight,
                              k_norm=k_norm.weight, eps=1e-6)
    torch.testing.assert_close(q_out, want_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(keys, want_k, atol=1e-6, rtol=1e-6)
    assert torch.equal(values, want_v)


def _tiny_qwen3(seed: int, hidden: int, device):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.35,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = Qwen3ForCausalLM(cfg).float().to(device).eval()
    with torch.no_grad():  # norms that do something
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_qwen3_q_k_norms_run_in_the_rotation_kernel(device, paged, monkeypatch):
    """Qwen3's per-head q/k norms put off to the rotation-and-store kernel (rope_store.NORMS) give the same tokens
    and logits as the norms run apart, and the kernel really normalizes (every launch gets the norms' weights);
    static and paged caches alike."""
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine
    from tiny_models import prompt

    llm, slm = _tiny_qwen3(0, 64, device), _tiny_qwen3(1, 32, device)
    launched = []
    original = rope_store.rope_store
    monkeypatch.setattr(torch.ops.hf_rstitch, "rope_store",
                        lambda *a: launched.append(a[11] is not None) or original(*a), raising=False)
    route = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 4 + ["llm"] + ["slm"] * 2
    outs = []
    for norms in (True, False):
        monkeypatch.setattr(rope_store, "NORMS", norms)
        monkeypatch.setattr(rope_store, "_VERDICTS", type(rope_store._VERDICTS)())
        launched.clear()
        engine = FastEngine(FastConfig(max_bucket=4, graphs=device == "cuda", paged=paged))
        outs.append(llm.generate(prompt(12).to(device), assistant_model=slm, stitch_policy=ReplayPolicy(route),
                                 stitch_engine=engine, max_new_tokens=len(route), min_new_tokens=len(route),
                                 return_dict_in_generate=True, output_logits=True))
        lane = engine._lanes[next(iter(engine._lanes))]
        assert lane._defer and len(lane._qk_norms) == 4  # two layers' q_norm and k_norm
        assert launched and all(launched) == norms and any(launched) == norms
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
