"""Do the residual adds and RMSNorms of a layer pay for themselves folded into the one-row products around them?

    PYTHONPATH=.:benchmarks python benchmarks/fold_bench.py --out-dir $OUT          # CUDA, ~1 min
    TRITON_INTERPRET=1 PYTHONPATH=.:benchmarks python benchmarks/fold_bench.py --dry-run-cpu --out-dir /tmp/f

A decode step of a pre-norm layer at one row runs, around its attention: add+norm (one compiled kernel),
the q/k/v product, ..., the o product, add+norm, the gated MLP product, the down product. Folded, the
norms run in the prologues of the q/k/v and gated products (each program reduces the whole input row) and
the adds in the epilogues of the o and down products: four kernels a layer instead of six. This times both
chains over ``--layers`` layers of Qwen2-1.5B (or 7B) shapes with random bf16 weights, each layer its own
weights (no product finds its weight in L2), recorded in one CUDA graph, with the tuner's configurations;
the attention is left out (the same in both). Writes ``fold_bench_<model>_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

import lab

SHAPES = {"1.5b": (1536, 2048, 8960), "7b": (3584, 4608, 18944)}  # hidden, q/k/v outputs, MLP width


def layer_weights(hidden: int, qkv: int, mlp: int, device: str) -> dict:
    mk = lambda n, k: torch.randn(n, k, dtype=torch.bfloat16, device=device) / k ** 0.5  # noqa: E731
    return {"qkv": mk(qkv, hidden), "qkv_b": torch.randn(qkv, dtype=torch.bfloat16, device=device) * 0.1,
            "o": mk(hidden, hidden), "gate": mk(mlp, hidden), "up": mk(mlp, hidden), "down": mk(hidden, mlp),
            "n1": torch.rand(hidden, dtype=torch.bfloat16, device=device) + 0.5,
            "n2": torch.rand(hidden, dtype=torch.bfloat16, device=device) + 0.5}


def chains(layers: list, cfg, add_norm, eps: float = 1e-6):
    """``(apart, folded)``: functions of (hidden, residual) running every layer's products, attention left out
    (its output stands in as the q/k/v product's first ``hidden`` columns)."""
    from hf_rstitch.fast import gated, gemv

    def apart(h, r):
        for w in layers:
            r, x = add_norm(w["n1"], r, h)
            qkv = gemv.launch(x, w["qkv"], w["qkv_b"], cfg["qkv"])
            a = gemv.launch(qkv[..., :x.shape[-1]], w["o"], None, cfg["o"])
            r, x = add_norm(w["n2"], r, a)
            h = gemv.launch(gated.launch(x, w["gate"], w["up"], cfg["gate"]), w["down"], None, cfg["down"])
        return r + h

    def folded(h, r):
        r = r + h  # the layer's input: the stream after the previous layer's closing add
        for w in layers:
            qkv = gemv.launch(r, w["qkv"], w["qkv_b"], cfg["qkv"], norm=w["n1"], eps=eps)
            r = gemv.launch(qkv[..., :r.shape[-1]], w["o"], None, cfg["o"], residual=r)
            r = gemv.launch(gated.launch(r, w["gate"], w["up"], cfg["gate"], norm=w["n2"], eps=eps), w["down"],
                            None, cfg["down"], residual=r)
        return r

    return apart, folded


def compiled_add_norm(eps: float, device: str):
    """The add and RMSNorm as ``compile="parts"`` runs them: one compiled piece (eager on CPU)."""
    from hf_rstitch.fast import gemv

    def add_norm(weight, residual, h):
        total = residual + h
        return total, gemv.rms_norm(total, weight, eps)

    return torch.compile(add_norm, dynamic=True, fullgraph=True) if device == "cuda" else add_norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--model", choices=list(SHAPES), default="1.5b")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--repeats", type=int, default=20, help="graph replays timed (median)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny shapes on CPU (run with TRITON_INTERPRET=1)")
    args = ap.parse_args()
    from hf_rstitch.fast import gated, gemv, triton_support

    device = "cpu" if args.dry_run_cpu else "cuda"
    hidden, qkv, mlp = (64, 96, 128) if args.dry_run_cpu else SHAPES[args.model]
    layers = [layer_weights(hidden, qkv, mlp, device) for _ in range(2 if args.dry_run_cpu else args.layers)]
    w = layers[0]
    cfg = {"qkv": gemv.tune(w["qkv"], w["qkv_b"]), "o": gemv.tune(w["o"], None), "down": gemv.tune(w["down"], None),
           "gate": gated.tune(w["gate"], w["up"], gated.CANDIDATES)}
    apart, folded = chains(layers, cfg, compiled_add_norm(1e-6, device))
    h, r = (torch.randn(1, 1, hidden, dtype=torch.bfloat16, device=device) for _ in range(2))
    want, got = apart(h, r), folded(h, r)
    err = (want.float() - got.float()).abs().max().item()
    scale = want.float().abs().max().item()
    doc = {"environment": lab.environment([device]), "args": vars(args), "configs": {k: repr(v) for k, v in cfg.items()},
           "max_abs_difference": err, "max_abs_output": scale, "pdl": triton_support.PDL}
    if device == "cuda":
        for name, fn in (("apart", apart), ("folded", folded)):
            fn(h, r)  # builds the kernels outside the capture
            doc[f"{name}_ms_per_layer"] = triton_support.graph_ms(lambda: fn(h, r), 1, args.repeats) / args.layers
        doc["saved_us_per_layer"] = 1e3 * (doc["apart_ms_per_layer"] - doc["folded_ms_per_layer"])
    gpu = re.sub(r"[^a-z0-9]+", "_", doc["environment"]["devices"][0].lower()).strip("_") if device == "cuda" else "cpu"
    stem = Path(args.out_dir) / f"fold_bench_{args.model.replace('.', '_')}_{gpu}"
    lab.write_result(stem, doc, markdown(doc))
    print(markdown(doc))
    sys.exit(0 if err <= 0.05 * max(scale, 1.0) else 1)


def markdown(doc: dict) -> str:
    env, a = doc["environment"], doc["args"]
    lines = [f"# Adds and norms folded into the one-row products: Qwen2-{a['model']} shapes, bf16, "
             f"{', '.join(env['devices'])}", "",
             f"torch {env['torch']}, {env['date']}; {a['layers']} layers, each its own weights, one CUDA graph, "
             f"median of {a['repeats']} replays; PDL {doc['pdl']}; attention left out. Configurations: "
             + ", ".join(f"{k} {v}" for k, v in doc["configs"].items()), ""]
    if "apart_ms_per_layer" in doc:
        lines += ["| chain | kernels a layer | us a layer |", "|---|---|---|",
                  f"| apart (add+norm, q/k/v, o, add+norm, gated, down) | 6 | {1e3 * doc['apart_ms_per_layer']:.2f} |",
                  f"| folded (q/k/v+norm, o+add, gated+norm, down+add) | 4 | {1e3 * doc['folded_ms_per_layer']:.2f} |",
                  "", f"Saved: {doc['saved_us_per_layer']:.2f} us a layer."]
    lines.append(f"\nLargest difference between the chains' outputs: {doc['max_abs_difference']:.4g} "
                 f"(largest output {doc['max_abs_output']:.4g}).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
