"""Rows beyond 64 (to 256) on the fast path: batch buckets up to 256 rows, products past
:data:`~hf_rstitch.fast.kernels.gemv.GEMM_ROWS` rows on cuBLAS's GEMMs, and batches of 65..130 rows equal to the eager
engine's -- through ``generate`` and through the request engine with rows joining and leaving. CPU, tiny models."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.kernels import gemv
from hf_rstitch.fast.patches import gated_mlp, linears
from hf_rstitch.fast.buckets import bucket_for
from hf_rstitch.fast.routes import route
from hf_rstitch.fast.rows import RowSlots, batch_sizes
from tiny_models import left_pad, make_pair, prompt

CPU = FastConfig(max_bucket=4, graphs=False)


def test_batch_buckets_reach_256_rows():
    assert batch_sizes(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert batch_sizes(130) == (1, 2, 4, 8, 16, 32, 64, 128, 130)
    assert [bucket_for(b, batch_sizes(256)) for b in (65, 128, 129, 200, 256)] == [128, 128, 256, 256, 256]
    rows = RowSlots(256)
    rows.start([0] * 256)
    assert rows.bucket == 256
    moves = rows.keep(list(range(0, 256, 2)))  # 128 live rows: those above cache row 127 move down
    assert rows.bucket == 128 and len(moves) == 64 and sorted(rows.slot) == list(range(128))


def test_products_past_64_rows_run_cublas_gemms(monkeypatch):
    """Up to GEMM_ROWS rows a tuned tier's kernel runs; past it ``F.linear`` (cuBLAS's GEMMs on a GPU), untuned."""
    assert gemv.GEMM_ROWS == 64 and gemv.tier(64) == 2 and gemv.tier(65) is None and gemv.tier(256) is None
    direct = []
    monkeypatch.setattr(linears, "_reference", lambda *a, **k: direct.append(a[0].shape[0]) or gemv._reference(*a, **k))
    w, b = torch.randn(24, 16), torch.randn(24)
    cfgs = tuple(gemv.GemvConfig(block_m=top) if top == 1 else gemv.GemvConfig(32, 128, 4, 2, top) for top in gemv.TIERS)
    for rows in (64, 65, 256):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(linears._gemv(x, w, b, cfgs), torch.nn.functional.linear(x, w, b))
    assert direct == [65, 256]  # 64 rows went to the tuned op (its CPU fallback), the others to cuBLAS directly
    mlp = make_pair("llama")[0].model.layers[0].mlp
    x = torch.randn(65, mlp.gate_proj.in_features, dtype=mlp.gate_proj.weight.dtype)
    cfg = gemv.GemvConfig(32, 128, 4, 2, gemv.WIDE_ROWS)
    torch.testing.assert_close(gated_mlp._forward(mlp, (cfg, cfg, cfg), None, x), mlp(x))  # the module's products


def _routes(n: int, new: int) -> list[list[str]]:
    return [route(new, new // 3, 2.0, seed=300 + r) for r in range(n)]


@pytest.mark.parametrize("batch", [65, 130])
def test_wide_batches_equal_the_default_engine(batch):
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(3 + r % 9, seed=500 + r) for r in range(batch)])
    routes = _routes(batch, 8)
    kw = dict(attention_mask=mask, assistant_model=slm, max_new_tokens=8, return_dict_in_generate=True)
    ref = llm.generate(ids, stitch_policy=ReplayPolicy(routes), stitch_engine="default", **kw)
    engine = FastEngine(CPU)
    out = llm.generate(ids, stitch_policy=ReplayPolicy(routes), stitch_engine=engine, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert [t.roles for t in out.stitch] == [t.roles for t in ref.stitch]
    assert engine._lanes[Role.LLM].max_rows == batch and engine._lanes[Role.LLM].rows.sizes[-1] == batch


def test_request_engine_past_64_rows_equals_the_eager_lanes():
    """80 requests through 70 rows: joins into a batch of more than 64 rows, rows leaving and taking their places;
    the fast lanes' completions equal the eager lanes'."""
    llm, slm = make_pair("qwen2-full")
    reqs = lambda: [Request(prompt(2 + i % 11, seed=700 + i)[0].tolist(), max_new_tokens=3 + i % 7,  # noqa: E731
                            stitch_threshold=0.3 + 0.05 * (i % 6), request_id=f"r{i}") for i in range(80)]
    eager = RequestEngine.of(llm, slm, max_batch=70, engine="default").run(reqs())
    fast = RequestEngine.of(llm, slm, max_batch=70, max_length=32, engine=CPU).run(reqs())
    assert {k: (c.tokens, c.finish_reason, c.trace.roles) for k, c in fast.items()} == \
        {k: (c.tokens, c.finish_reason, c.trace.roles) for k, c in eager.items()}
