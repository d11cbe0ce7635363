"""Products of a few rows (batched decode steps): cuBLAS against every candidate of the Triton tiers.

    PYTHONPATH=.:benchmarks python benchmarks/gemv_rows_sweep.py --out-dir $OUT     # CUDA, ~1 min for 7B

For the q/k/v (fused), o, down and gated gate/up products of Qwen2-1.5B and Qwen2-7B (bf16, random
weights) at 8, 32 and 64 rows, it times cuBLAS (``F.linear``; for the gated product two products
and the activation) and each candidate of the tier the rows fall in (:data:`hf_rstitch.fast.gemv.FEW_ROWS`
up to 16 rows, :data:`~hf_rstitch.fast.gemv.WIDE` above; :mod:`hf_rstitch.fast.gated`'s for gate/up).

Each timing is ``--calls`` products recorded in one CUDA graph, each reading another copy of the weight
(at least ``--cold-mb`` of copies), so that no product finds its weight in L2 -- as in a decode step,
where the rest of the model passes between two reads of a weight. The tuner times one weight over and
over, which favours small weights' configurations that L2 serves; ``--hot`` times that way too.

Writes ``<name>_<gpu>.json`` (every candidate's time) and ``.md`` (the best of each, against cuBLAS and
against the weights' bytes over the measured copy bandwidth).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_rstitch.fast import gated, gemv, triton_support

SHAPES = {  # name -> (N, K, bias, gated); Qwen2 configs: hidden 1536/3584, MLP 8960/18944, KV heads 2/4 of 128
    "1.5b qkv": (2048, 1536, True, False), "1.5b o": (1536, 1536, False, False),
    "1.5b gate+up": (8960, 1536, False, True), "1.5b down": (1536, 8960, False, False),
    "7b qkv": (4608, 3584, True, False), "7b o": (3584, 3584, False, False),
    "7b gate+up": (18944, 3584, False, True), "7b down": (3584, 18944, False, False),
}


def weights(n: int, k: int, bias: bool, pair: bool, copies: int):
    mk = lambda: torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02  # noqa: E731
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda") if bias else None
    return [((mk(), mk()) if pair else mk(), b) for _ in range(copies)]


def timer(ws, x, calls: int):
    """``time(run)``: ms per product of ``run(w, b)`` over ``calls`` products cycling through ``ws``."""
    def time(run):
        it = iter(range(10 ** 9))
        return triton_support.graph_ms(lambda: run(*ws[next(it) % len(ws)]), calls, repeats=3)
    return time


def sweep_shape(name, n, k, bias, pair, rows, args) -> dict:
    mb = n * k * 2 * (2 if pair else 1) / 1e6
    copies = 1 if args.hot else max(2, int(args.cold_mb / mb) + 1)
    ws = weights(n, k, bias, pair, copies)
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    time = timer(ws, x, args.calls)
    if pair:
        cands = gated.FEW_ROWS if rows <= gemv.MAX_ROWS else gated.WIDE
        cublas = time(lambda w, b: gated.reference(x, *w))
        run = lambda cfg: time(lambda w, b: gated.launch(x, w[0], w[1], cfg))  # noqa: E731
    else:
        cands = gemv.FEW_ROWS if rows <= gemv.MAX_ROWS else gemv.WIDE
        cublas = time(lambda w, b: F.linear(x, w, b))
        run = lambda cfg: time(lambda w, b: gemv.launch(x, w, b, cfg))  # noqa: E731
    per = {}
    for cfg in cands:
        try:
            per[str(cfg)] = run(cfg)
        except Exception as exc:  # noqa: BLE001 - a configuration the device cannot run: report, go on
            per[str(cfg)] = f"failed: {type(exc).__name__}: {exc}"[:200]
    timed = {c: t for c, t in per.items() if isinstance(t, float)}
    best = min(timed, key=timed.get) if timed else None
    del ws
    return {"shape": name, "N": n, "K": k, "rows": rows, "weight_mb": mb, "copies": copies,
            "cublas_ms": cublas, "best": best, "best_ms": timed.get(best), "candidates_ms": per}


def write_table(meta: dict, results: list[dict], out: Path, name: str) -> None:
    """The Markdown table of a sweep (floors: weight bytes over ``meta["copy_gbs"]``)."""
    bw = meta["copy_gbs"]
    gpu = meta["device"].lower().replace(" ", "_")
    lines = [f"# Few-rows products: cuBLAS against the Triton tiers' candidates, {meta['device']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; bf16, {meta['calls_per_graph']} products "
             f"per CUDA graph, {'one weight (L2-hot)' if meta['hot'] else 'cycling through weight copies (L2-cold)'}; "
             f"floor: weight bytes over {bw:.0f} GB/s ({meta.get('bandwidth_note', 'copy bandwidth, read + write')}).",
             "", "| product | N x K | rows | floor us | cuBLAS us | best Triton us | x floor (cuBLAS / Triton) | "
             "best candidate |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        f = r["weight_mb"] / 1e3 / bw * 1e3  # ms
        t = r["best_ms"] or float("nan")
        cfg = (r["best"] or "-").replace("GemvConfig", "").replace("block_", "").replace("num_", "")
        lines.append(f"| {r['shape']} | {r['N']} x {r['K']} | {r['rows']} | {f * 1e3:.2f} | {r['cublas_ms'] * 1e3:.2f} | "
                     f"{t * 1e3:.2f} | {r['cublas_ms'] / f:.2f} / {t / f:.2f} | {cfg} |")
    lines += ["", f"Regenerate: `PYTHONPATH=.:benchmarks {meta['command']}`"]
    (out / f"{name}_{gpu}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), metavar="SHAPE",
                    help=f"products to time, of {list(SHAPES)}")
    ap.add_argument("--calls", type=int, default=20, help="products per recorded graph")
    ap.add_argument("--cold-mb", type=float, default=400, help="copies of each weight to cycle through, in MB")
    ap.add_argument("--hot", action="store_true", help="one weight over and over, as the tuner times")
    ap.add_argument("--name", default="gemv_rows_sweep")
    ap.add_argument("--rewrite", metavar="JSON", help="no timing: write the table of an earlier sweep's JSON again")
    ap.add_argument("--bandwidth", type=float, help="with --rewrite: the floor's copy bandwidth (GB/s, read + write)")
    ap.add_argument("--bandwidth-note", default="copy bandwidth, read + write", help="with --rewrite: its source")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.rewrite:
        data = json.loads(Path(args.rewrite).read_text())
        if args.bandwidth:
            data["copy_gbs"], data["bandwidth_note"] = args.bandwidth, args.bandwidth_note
        (out / Path(args.rewrite).name).write_text(json.dumps(data, indent=1))
        write_table(data, data["rows"], out, args.name)
        return
    if not torch.cuda.is_available():
        sys.exit("gemv_rows_sweep needs a CUDA device")
    import triton

    from engine_bench import copy_bandwidth

    torch.manual_seed(0)
    bw = copy_bandwidth()
    results = []
    for name in args.shapes:
        n, k, bias, pair = SHAPES[name]
        for rows in args.rows:
            r = sweep_shape(name, n, k, bias, pair, rows, args)
            results.append(r)
            floor_ms = r["weight_mb"] / bw  # MB over GB/s
            print(f"{name:12s} rows {rows:3d}: cuBLAS {r['cublas_ms'] * 1e3:7.2f} us, best Triton "
                  f"{(r['best_ms'] or float('nan')) * 1e3:7.2f} us {r['best']}, floor {floor_ms * 1e3:6.2f} us",
                  flush=True)
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "copy_gbs": bw, "calls_per_graph": args.calls, "hot": args.hot, "command": "python " + " ".join(sys.argv)}
    gpu = meta["device"].lower().replace(" ", "_")
    (out / f"{args.name}_{gpu}.json").write_text(json.dumps({**meta, "rows": results}, indent=1))
    write_table(meta, results, out, args.name)


if __name__ == "__main__":
    main()
