"""Fold costs in the tuner's terms (one-off, issue 39): each one-row candidate timed L2-cold without and with the fold it runs with
in a step (qkv and gated: RMSNorm prologue; o and down: residual add)."""
import torch
from hf_rstitch.fast.kernels import gated, gemv
from hf_rstitch.fast.kernels.triton_support import cold_copies, cycling, graph_ms

SHAPES = {  # model: (hidden, qkv out, o in, inter)
    "qwen3-0.6b": (1024, 4096, 2048, 3072), "qwen2-1.5b": (1536, 2048, 1536, 8960), "qwen3-8b": (4096, 6144, 4096, 12288)}
dev, dt = "cuda", torch.bfloat16
for model, (h, qkv, o_in, inter) in SHAPES.items():
    nw = torch.randn(h, device=dev, dtype=dt)
    cases = [("qkv+norm", "gemv", (qkv, h), "norm"), ("o+add", "gemv", (h, o_in), "add"),
             ("gated+norm", "gated", (inter, h), "norm"), ("down+add", "gemv", (h, inter), "add")]
    for name, kind, (n, k), fold in cases:
        x = torch.randn(1, k, device=dev, dtype=dt)
        r = torch.randn(1, n, device=dev, dtype=dt)
        if kind == "gemv":
            w = torch.randn(n, k, device=dev, dtype=dt) * 0.02
            nxt = cycling(cold_copies((w,), 20))
            run = lambda cfg, f: gemv.launch(x, nxt()[0], None, cfg, norm=nw if f == "norm" else None, eps=1e-6,
                                             residual=r if f == "add" else None)
            cands = gemv.CANDIDATES
        else:
            g, u = (torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(2))
            nxt = cycling(cold_copies((g, u), 20))
            run = lambda cfg, f: gated.launch(x, *nxt(), cfg, norm=nw if f == "norm" else None, eps=1e-6)
            cands = gated.CANDIDATES
        res = {}
        for cfg in cands:
            try:
                res[cfg] = (graph_ms(lambda: run(cfg, None), 20) * 1e3, graph_ms(lambda: run(cfg, fold), 20) * 1e3)
            except Exception as e:  # noqa
                continue
        plain = min(res, key=lambda c: res[c][0])
        folded = min(res, key=lambda c: res[c][1])
        print(f"{model} {name} {n}x{k}: plain-best {plain.block_n}/{plain.block_k}/{plain.num_warps} "
              f"plain {res[plain][0]:.2f} us folded {res[plain][1]:.2f} us | folded-best {folded.block_n}/"
              f"{folded.block_k}/{folded.num_warps} folded {res[folded][1]:.2f} us", flush=True)
