"""Every Triton launch a fast lane can make, driven through the kernels' own launch functions on CPU tensors.

tools/kernel_targets.py records these launches (it compiles them, it runs nothing): each ``(name, call)`` of
:func:`launch_sets` calls one kernel module's launch function with tensors of one shape, dtype and option --
each tuned configuration of the shipped GEMV tables (every entry, with its shape), every candidate of the tuners'
search spaces (what a GPU without a shipped table times), and the other kernels (attention, read-out, norms,
rotation and cache stores, MoE routers and experts) at the head sizes, batches and options lanes use.
"""

from __future__ import annotations

import json
from typing import Callable, Iterator

import torch

from hf_rstitch.fast.blocks import BLOCK_TOKENS
from hf_rstitch.fast.kernels import (decode_attention, expert_gemv, fused_entropy, gated, gemv, moe_router, norms,
                                     rope_store, tuning_cache)
from hf_rstitch.fast.kernels.gemv import GemvConfig

DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32}
SEARCH_SHAPE = (4096, 4096)  # (N, K) the search spaces are compiled at (EVEN_N / EVEN_K: the tuned entries vary them)


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


def _product(kind: str, n: int, k: int, dtype, bias: bool, cfg: GemvConfig) -> Callable[[], object]:
    """One product of a table entry's ``kind`` ("", "gemv+add", "gemv+norm", "gated", "gated+norm")."""
    rows = cfg.block_m if cfg.block_m > 1 else 1
    x, w = _t(rows, k, dtype=dtype), _t(n, k, dtype=dtype)
    norm = _t(k, dtype=dtype) if kind.endswith("+norm") else None
    if kind.startswith("gated"):
        return lambda: gated.launch(x, w, _t(n, k, dtype=dtype), cfg, norm=norm, eps=1e-6)
    residual = _t(rows, n, dtype=dtype) if kind == "gemv+add" else None
    b = _t(n, dtype=dtype) if bias else None
    return lambda: gemv.launch(x, w, b, cfg, norm=norm, eps=1e-6, residual=residual)


def table_products() -> Iterator[tuple[str, object, Callable]]:
    """``(name, dtype, call)`` of every configured entry of every shipped tuning table."""
    for path in tuning_cache.SHIPPED_DIR.glob("*.json"):
        for key, value in json.loads(path.read_text())["entries"].items():
            if not value:
                continue  # cuBLAS kept: no kernel
            parts = json.loads(key)
            kind = parts.pop(0) if isinstance(parts[0], str) else "gemv"
            (n, k), dtype, bias = parts[0], DTYPES[parts[1]], parts[2]
            cfg = GemvConfig(**{f: v for f, v in value.items() if f != "type"})
            yield (f"{kind} {n}x{k} bias={bias} rows={parts[-1]} {path.stem}", dtype,
                   _product(kind, n, k, dtype, bias, cfg))


def search_products(dtype) -> Iterator[tuple[str, object, Callable]]:
    """Every candidate of the tuners' search spaces (one-row, few-rows, wide), plain and gated."""
    n, k = SEARCH_SHAPE
    for cfg in (*gemv.CANDIDATES, *gemv.FEW_ROWS, *gemv.WIDE):
        yield f"gemv search {cfg}", dtype, _product("gemv", n, k, dtype, False, cfg)
        if cfg.block_m <= gemv.MAX_ROWS:
            yield f"gated search {cfg}", dtype, _product("gated", n, k, dtype, False, cfg)
    yield "gemv+norm search", dtype, _product("gemv+norm", n, k, dtype, False, gemv.CANDIDATES[0])
    yield "gemv+add search", dtype, _product("gemv+add", n, k, dtype, True, gemv.CANDIDATES[0])


def _attention(dim: int, batch: int, q_len: int, dtype, paged=False, softcap=0.0, sinks=False, slots=4096):
    heads, kv_heads = 8, 2
    q = _t(batch, heads, q_len, dim, dtype=dtype)
    pos = torch.zeros(batch, dtype=torch.long)
    pad = torch.zeros(batch, dtype=torch.long)
    if paged:
        blocks = slots // BLOCK_TOKENS
        k = _t(blocks * batch + 1, kv_heads, BLOCK_TOKENS, dim, dtype=dtype)
        table = torch.zeros(batch, blocks, dtype=torch.int32)
    else:
        k, table = _t(batch, kv_heads, slots, dim, dtype=dtype), None
    sink = _t(heads, dtype=torch.float32) if sinks else None
    return lambda: decode_attention._launch(q, k, k.clone(), pos, pad, 0.1, softcap=softcap, sinks=sink, table=table)


def attention(dtype) -> Iterator[tuple[str, object, Callable]]:
    for dim in (64, 128, 256):
        for batch, q_len in ((1, 1), (8, 1), (64, 1), (1, 16), (8, 16)):
            yield f"attention d{dim} b{batch} q{q_len}", dtype, _attention(dim, batch, q_len, dtype)
        yield f"attention d{dim} paged", dtype, _attention(dim, 8, 1, dtype, paged=True)
    yield "attention softcap", dtype, _attention(256, 1, 1, dtype, softcap=50.0)
    yield "attention sinks", dtype, _attention(64, 1, 1, dtype, sinks=True)


def read_out(dtype) -> Iterator[tuple[str, object, Callable]]:
    for rows in (1, 8, 64):
        x = _t(rows, 151936, dtype=dtype)
        yield f"read_out r{rows}", dtype, (lambda x=x: fused_entropy.read_out(x))
        yield f"entropy r{rows}", dtype, (lambda x=x: fused_entropy.normalized_entropy(x))
    x = _t(8, 32000, dtype=dtype)
    yield "read_out gather", dtype, lambda: fused_entropy.read_out(x, torch.zeros(3, dtype=torch.long))


def small(dtype) -> Iterator[tuple[str, object, Callable]]:
    """Norms, SiLU-mul, rotation and cache stores."""
    for width in (896, 1536, 3584, 4096):
        x, w = _t(4, width, dtype=dtype), _t(width, dtype=dtype)
        yield f"rms_norm {width}", dtype, (lambda x=x, w=w: norms.rms_norm(x, w, 1e-6))
        yield f"add_rms_norm {width}", dtype, (lambda x=x, w=w: norms.add_rms_norm(x, x.clone(), w, 1e-6))
        yield f"silu_mul {width}", dtype, (lambda x=x: norms.silu_mul(x, x.clone()))
    for dim in (64, 128, 256):
        for paged, qk_norm in ((False, False), (True, False), (False, True)):
            yield f"rope_store d{dim} paged={paged} norm={qk_norm}", dtype, _rope_store(dim, dtype, paged, qk_norm)
        yield f"store_kv d{dim}", dtype, _store(dim, dtype)
        q, cos = _t(1, 8, 1, dim, dtype=dtype), _t(1, 1, dim, dtype=dtype)
        yield f"rotate_qk d{dim}", dtype, (lambda q=q, cos=cos: rope_store.rotate_qk(q, q[:, :2].contiguous(), cos, cos))


def _rope_store(dim: int, dtype, paged: bool, qk_norm: bool) -> Callable:
    b, hq, hk, s, slots = 2, 8, 2, 1, 256
    q, k = _t(b, hq, s, dim, dtype=dtype), _t(b, hk, s, dim, dtype=dtype)
    cos = _t(b, s, dim, dtype=dtype)
    positions = torch.zeros(b, s, dtype=torch.long)
    if paged:
        keys = _t(b * slots // BLOCK_TOKENS + 1, hk, BLOCK_TOKENS, dim, dtype=dtype)
        table, pad = torch.zeros(b, slots // BLOCK_TOKENS, dtype=torch.int32), torch.zeros(b, dtype=torch.long)
    else:
        keys, table, pad = _t(b, hk, slots, dim, dtype=dtype), None, None
    qn = _t(dim, dtype=dtype) if qk_norm else None
    return lambda: rope_store.rope_store(q, k, k.clone(), cos, cos, positions, torch.empty_like(q), keys, keys.clone(),
                                         table, pad, qn, qn, 1e-6)


def _store(dim: int, dtype) -> Callable:
    k, keys = _t(2, 2, 3, dim, dtype=dtype), _t(2, 2, 64, dim, dtype=dtype)
    return lambda: rope_store.store_kv(k, k.clone(), torch.zeros(3, dtype=torch.long), keys, keys.clone())


def moe(dtype) -> Iterator[tuple[str, object, Callable]]:
    """MoE routers (Qwen3-MoE 128 experts top 8, Mixtral 8 top 2) and expert kernels (pair and expert-major)."""
    for experts, top in ((128, 8), (8, 2), (64, 6)):
        x, w = _t(4, 2048, dtype=dtype), _t(experts, 2048, dtype=dtype)
        yield f"router {experts}/{top}", dtype, (lambda x=x, w=w, top=top: moe_router.route(x, w, top, True))
    hidden, inter, experts = 2048, 768, 8
    gate_up, down = _t(experts, 2 * inter, hidden, dtype=dtype), _t(experts, hidden, inter, dtype=dtype)
    for tokens in (1, 4, 64):
        x, ids = _t(tokens, hidden, dtype=dtype), torch.zeros(tokens, 2, dtype=torch.long)
        act, weights = _t(tokens * 2, inter, dtype=dtype), _t(tokens, 2, dtype=dtype)
        yield f"experts gate_up t{tokens}", dtype, (lambda x=x, ids=ids: expert_gemv.gate_up(x, gate_up, ids))
        yield f"experts down t{tokens}", dtype, (lambda a=act, ids=ids, w=weights: expert_gemv.down(a, down, ids, w))
        yield (f"experts down t{tokens} float32 weights", dtype,
               (lambda a=act, ids=ids, w=weights: expert_gemv.down(a, down, ids, w.float())))


def launch_sets(dtypes=(torch.bfloat16, torch.float16, torch.float32)) -> Iterator[tuple[str, object, Callable]]:
    """``(name, dtype, call)`` of every launch set: the shipped tables' entries, then per dtype the rest (float32
    too: the GPU zoo runs tiny float32 models through the same kernels)."""
    yield from table_products()
    for dtype in dtypes:
        for source in (search_products, attention, read_out, small, moe):
            yield from source(dtype)
