"""A layer's residual adds and RMSNorms folded into its one-row products (hf_rstitch.fast.patches.folds).

The kernels run on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1); those tests skip otherwise.
"""

import pytest
import torch
from tiny_models import kernel_model

from hf_rstitch.fast.patches import add_norm, folds, gated_mlp, linears
from hf_rstitch.fast.kernels import gated, gemv
from hf_rstitch.fast.patches.products import fold_jobs

CUDA = torch.cuda.is_available()
DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")), ("cuda", CUDA and gemv.available("cuda"))) if ok]
needs_kernels = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


def _plan(model, table=None):
    """The lane's products and layer forwards (the add+norm pieces uncompiled)."""
    table = {} if table is None else table
    products = linears.plan(model, table, fuse=True) + gated_mlp.plan(model, table)
    return products, add_norm.plan(model, lambda key, fn: fn, products)


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_folded_layers_equal_the_model(device, arch, monkeypatch):
    """One row: every layer folds (two folds a layer, each taken) and the logits are the model's own; several
    rows keep the add+norm pieces."""
    model = kernel_model(device, arch)
    products, layers = _plan(model)
    assert all(folds.foldable(layer, dict(products)) for layer in model.model.layers)
    seen = []
    real = folds.folding

    def counting(norm, add):
        seen.append(norm[1])
        return real(norm, add)

    monkeypatch.setattr(folds, "folding", counting)
    with torch.no_grad():
        for width in (1, 3):
            ids = torch.randint(0, 97, (1, width), device=device)
            want = model(ids).logits
            with linears.gemv_linears_on(products + layers):
                got = model(ids).logits
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            assert len(seen) == (2 * len(model.model.layers) if width == 1 else 0)
            seen.clear()


def test_fold_only_where_every_part_takes_it(monkeypatch):
    """foldable: off with ENABLED False, a norm that is not Llama's RMSNorm, an attention that does more than
    project, or products that are not the kernels taking folds (q/k/v apart, an MLP not fused)."""
    model = kernel_model("cpu", "qwen2")
    table = {}
    products = dict(linears.plan(model, table, fuse=True) + gated_mlp.plan(model, table))
    layer = model.model.layers[0]
    assert folds.foldable(layer, products)  # off CUDA the plans install the forwards all the same
    monkeypatch.setattr(folds, "ENABLED", False)
    assert not folds.foldable(layer, products)
    monkeypatch.setattr(folds, "ENABLED", True)
    assert not folds.foldable(layer, dict(linears.plan(model, table, fuse=False) + gated_mlp.plan(model, table)))
    assert not folds.foldable(layer, dict(linears.plan(model, table, fuse=True)))  # the MLP keeps its forward
    original = layer.post_attention_layernorm
    layer.post_attention_layernorm = torch.nn.LayerNorm(64)
    assert not folds.foldable(layer, products)
    layer.post_attention_layernorm = original
    layer.input_layernorm.double()  # a norm in another dtype than the products
    assert not folds.foldable(layer, products)
    layer.input_layernorm.float()
    assert folds.foldable(layer, products)

    class GatedAttention(type(layer.self_attn)):
        def forward(self, hidden_states, **kwargs):
            out, weights = super().forward(hidden_states, **kwargs)
            return out * 0.5, weights

    layer.self_attn.__class__ = GatedAttention
    assert not folds.foldable(layer, products)


def test_a_fold_nobody_takes_is_an_error():
    model = kernel_model("cpu", "llama")
    layer = model.model.layers[0]
    x = torch.randn(1, 1, 64)
    with pytest.raises(RuntimeError, match="did not run it"):
        with folds.folding((x, layer.input_layernorm), (layer.self_attn.o_proj, x)):
            pass
    with folds.folding((x, layer.input_layernorm), (layer.self_attn.o_proj, x)):
        assert folds.norm_for(torch.randn(1, 1, 64)) is None  # another tensor: not its norm
        assert folds.norm_for(x)[0] is layer.input_layernorm.weight
        assert folds.residual_for(layer.mlp.down_proj) is None
        assert folds.residual_for(layer.self_attn.o_proj) is x
    assert folds.norm_for(x) is None  # nothing pending after the block


def test_pending_lists_the_folded_products_once_a_shape():
    """fold_jobs: the four folded products (q/k/v with its norm, o with its add, the gated MLP with its
    norm, down with its add) once for layers of one shape, with the tuner's one-row configurations; none where
    no layer folds."""
    model = kernel_model("cpu", "qwen2")
    products, _ = _plan(model)
    jobs = fold_jobs(model, products)
    assert len(jobs) == 4
    layer, installed = model.model.layers[0], dict(products)
    attn, mlp = layer.self_attn, layer.mlp
    runs = [run for _, run in jobs]
    assert runs[0].keywords["norm"] is layer.input_layernorm.weight and runs[0].args[1].shape == (64 + 2 * 32, 64)
    assert runs[1].args[1] is attn.o_proj.weight and "residual" in runs[1].keywords
    assert runs[2].func is gated.launch and runs[2].keywords["norm"] is layer.post_attention_layernorm.weight
    assert runs[3].args[1] is mlp.down_proj.weight and "residual" in runs[3].keywords
    assert jobs[1][0] == (installed[attn.o_proj].args[1][0],)
    assert fold_jobs(model, linears.plan(model, {}, fuse=True)) == []  # the MLP not fused: no layer folds


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_pending_folded_products_run(device):
    """Each listed job runs as listed (the partials are whole launches)."""
    model = kernel_model(device, "llama")
    products, _ = _plan(model)
    jobs = fold_jobs(model, products)
    assert len(jobs) == 4
    for candidates, run in jobs:  # stand-in inputs: the values are whatever empty memory held
        assert run(candidates[0]).shape[-2:] == (1, run.args[1].shape[0])


@pytest.mark.skipif(not CUDA, reason="needs CUDA (Triton compiles for a GPU)")
def test_folded_forward_after_precompile_builds_nothing(monkeypatch):
    """After precompiling fold_jobs, a folded one-row forward builds no folded GEMV or gated kernel."""
    pytest.importorskip("triton")
    from triton import knobs

    from hf_rstitch.fast.kernels import triton_support

    model = kernel_model("cuda", "qwen2")
    products, layers = _plan(model)
    ids = torch.randint(0, 97, (1, 1), device="cuda")
    for module in (gemv, gated):
        module._kernel.cache_clear()
    monkeypatch.setattr(triton_support, "COMPILE_THREADS", 4)
    built = []  # (kernel, folded: a norm before or an add after, specialization) of every build, in order

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        flags = {src.fn.arg_names[k[0]]: v for k, v in src.constants.items()}
        built.append((src.fn.__name__, bool(flags.get("NORM") or flags.get("ADD")), f"{flags} {src.attrs}"))

    monkeypatch.setattr(knobs.compilation, "listener", listen)
    try:
        triton_support.precompile(fold_jobs(model, products), "cuda")
        ahead = len(built)  # jobs of one specialization (o and down often are) share one build
        assert {"gemv_kernel", "gated_kernel"} <= {name for name, folded, _ in built if folded}
        with torch.no_grad(), linears.gemv_linears_on(products + layers):
            model(ids)
        torch.cuda.synchronize()
        later = [b for b in built[ahead:] if b[1]]  # the lm_head's plain product is the tuner's to build ahead
        assert later == [], f"built at the forward: {later}; ahead: {built[:ahead]}"
    finally:
        for module in (gemv, gated):
            module._kernel.cache_clear()


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_folded_products_are_tuned_as_they_run(device, monkeypatch):
    """fold_tuning.retune: each folded product's one-row configuration is tuned with its fold (the q/k/v group and
    the gated MLP with their norm, o and down with the add), kept under the fold's own key, installed in the lane's
    forwards (several-row tiers unchanged), and the folded layers still give the model's logits."""
    from hf_rstitch.fast.patches import fold_tuning

    model = kernel_model(device, "qwen2")
    table = {}
    products, _ = _plan(model, table)
    asked = []
    marked = gemv.GemvConfig(2, 64, 2, 2)  # a configuration no shape tuning chooses off CUDA

    def tune(kernel):
        def run(*weights_and_candidates, norm=None, eps=0.0, add=False):
            asked.append((kernel, norm is not None, add))
            return marked
        return run

    monkeypatch.setattr(gemv, "tune", tune("gemv"))
    monkeypatch.setattr(gated, "tune", tune("gated"))
    tuned = fold_tuning.retune(model, products, table)
    assert sorted(set(asked)) == [("gated", True, False), ("gemv", False, True), ("gemv", True, False)]
    assert {k[0] for k in table if isinstance(k[0], str)} >= set(fold_tuning.KINDS)
    installed = dict(tuned)
    layer = model.model.layers[0]
    group = installed[layer.self_attn.q_proj].func.__self__
    for cfgs, before in ((group.cfgs, None), (installed[layer.self_attn.o_proj].args[1],
                                              dict(products)[layer.self_attn.o_proj].args[1]),
                         (installed[layer.mlp].args[1], dict(products)[layer.mlp].args[1])):
        assert cfgs[0] == marked and (before is None or cfgs[1:] == before[1:])
    layers = add_norm.plan(model, lambda key, fn: fn, tuned)
    with torch.no_grad():
        ids = torch.randint(0, 97, (1, 1), device=device)
        want = model(ids).logits
        with linears.gemv_linears_on(tuned + layers):
            got = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
