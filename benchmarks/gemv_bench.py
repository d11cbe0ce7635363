"""Batch-1 linear layers on one GPU: cuBLAS (``F.linear``) against the tuned Triton kernel.

    PYTHONPATH=. python benchmarks/gemv_bench.py --out $OUT/gemv.json        # CUDA, ~1 min

For every weight shape of Qwen2-1.5B and Qwen2-7B (bf16, random weights; fused q/k/v shapes too)
it times one-row products both ways, each recorded ``--calls`` times in a CUDA graph so that
launch overhead is not counted, and reports microseconds and read bandwidth (weight bytes / time)
next to the device's copy bandwidth. The Triton column is the best of the tuner's candidates
(:data:`hf_rstitch.fast.gemv.CANDIDATES`); every candidate's time is kept in the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from hf_rstitch.fast import gemv, triton_support

SHAPES = {  # name -> (N, K, bias); Qwen2 configs: hidden 1536/3584, MLP 8960/18944, KV heads 2/4 of 128
    "1.5b q": (1536, 1536, True), "1.5b k/v": (256, 1536, True), "1.5b qkv fused": (2048, 1536, True),
    "1.5b o": (1536, 1536, False), "1.5b gate/up": (8960, 1536, False), "1.5b gate+up fused": (17920, 1536, False),
    "1.5b down": (1536, 8960, False), "1.5b lm_head": (151936, 1536, False),
    "7b q": (3584, 3584, True), "7b k/v": (512, 3584, True), "7b qkv fused": (4608, 3584, True),
    "7b o": (3584, 3584, False), "7b gate/up": (18944, 3584, False), "7b gate+up fused": (37888, 3584, False),
    "7b down": (3584, 18944, False), "7b lm_head": (152064, 3584, False),
}


def graph_us(fn, calls: int) -> float:
    """Median microseconds per call of ``fn`` replayed ``calls`` times inside one CUDA graph."""
    return 1000 * triton_support.graph_ms(fn, calls, repeats=5)


def copy_bandwidth(gb: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second (GB/s), as engine_bench measures it."""
    a = torch.empty(int(gb * 1e9 / 2), dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        b.copy_(a)
    end.record()
    end.synchronize()
    return 5 * 2 * a.numel() * 2 / (start.elapsed_time(end) * 1e-3) / 1e9


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON path; a Markdown table is written next to it")
    ap.add_argument("--calls", type=int, default=50, help="products per recorded graph")
    ap.add_argument("--few-rows", type=int, default=8, help="rows of the few-rows comparison (a catch-up prefill)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gemv_bench needs a CUDA device")
    import triton

    torch.manual_seed(0)
    copy_gbs = copy_bandwidth()
    rows = []
    for name, (n, k, bias) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        b = torch.randn(n, dtype=torch.bfloat16, device="cuda") if bias else None
        x = torch.randn(1, 1, k, dtype=torch.bfloat16, device="cuda")
        cublas = graph_us(lambda: torch.nn.functional.linear(x, w, b), args.calls)
        per_cfg = {}
        for cfg in gemv.CANDIDATES:
            try:
                per_cfg[str(cfg)] = graph_us(lambda: gemv.launch(x, w, b, cfg), args.calls)
            except Exception as exc:  # noqa: BLE001 - report and go on
                per_cfg[str(cfg)] = f"failed: {type(exc).__name__}"
        timed = {c: t for c, t in per_cfg.items() if isinstance(t, float)}
        best = min(timed, key=timed.get)
        tuned = gemv.tune(w, b)
        err = (gemv.launch(x, w, b, tuned).float() - torch.nn.functional.linear(x.float(), w.float(),
               b.float() if b is not None else None)).abs().max().item()
        x8 = torch.randn(1, args.few_rows, k, dtype=torch.bfloat16, device="cuda")
        few_cublas = graph_us(lambda: torch.nn.functional.linear(x8, w, b), args.calls)
        few = {str(c): graph_us(lambda: gemv.launch(x8, w, b, c), args.calls) for c in gemv.FEW_ROWS}
        few_best = min(few, key=few.get)
        gb = n * k * 2 / 1e9
        rows.append({"few_rows": args.few_rows, "few_rows_cublas_us": few_cublas, "few_rows_triton_us": few[few_best],
                     "few_rows_best": few_best, "few_rows_candidates_us": few,"shape": name, "N": n, "K": k, "bias": bias, "weight_mb": gb * 1e3,
                     "cublas_us": cublas, "triton_us": timed[best], "triton_best": best,
                     "tuner_pick": str(tuned), "cublas_gbs": gb / (cublas * 1e-6),
                     "triton_gbs": gb / (timed[best] * 1e-6), "max_abs_err_vs_fp32": err, "candidates_us": per_cfg})
        print(f"{name:20s} cuBLAS {cublas:8.2f} us {rows[-1]['cublas_gbs']:6.0f} GB/s | triton {timed[best]:8.2f} us "
              f"{rows[-1]['triton_gbs']:6.0f} GB/s  {best} | {args.few_rows} rows: cuBLAS {few_cublas:8.2f} us, "
              f"triton {few[few_best]:8.2f} us", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "copy_gbs": copy_gbs, "calls_per_graph": args.calls}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [f"# Batch-1 linear layers: cuBLAS vs tuned Triton GEMV, {meta['device']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; bf16, one row, {args.calls} products "
             f"per CUDA graph; copy bandwidth {copy_gbs:.0f} GB/s (read + write).", "",
             "| shape | N x K | MB | cuBLAS us | GB/s | Triton us | GB/s | best config | "
             f"{args.few_rows} rows: cuBLAS us | Triton us |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['N']} x {r['K']} | {r['weight_mb']:.1f} | {r['cublas_us']:.2f} | "
                     f"{r['cublas_gbs']:.0f} | {r['triton_us']:.2f} | {r['triton_gbs']:.0f} | {r['triton_best']} | "
                     f"{r['few_rows_cublas_us']:.2f} | {r['few_rows_triton_us']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
