"""Host cost of launching a decode step's CUDA graph, by batch size and BLAS library (one GPU).

    PYTHONPATH=.:benchmarks python benchmarks/graph_launch.py --out-dir $OUT     # CUDA, ~2 min

Through ``generate`` the fast engine's 7B step at B = 64 left the device idle ~1.1 ms a step (H200,
``engine_host_profile.py --batch 64``): 0.6 ms of it while ``cudaGraphLaunch`` ran on the host (0.12 ms
at B = 1). This script measures that call alone: the host seconds ``CUDAGraph.replay()`` takes while
the device is kept busy (so the call never waits for it), the device seconds a replay takes back to
back, and the seconds one replay takes from a launch onto an idle device (what a step waits through),

1. for a graph of the 7B's 28 layers of linear products only (q/k/v, o, gate/up, down) at M rows, with
   each BLAS library torch offers (``torch.backends.cuda.preferred_blas_library``);
2. for the fast engine's own 7B decode graph at B rows (``FastConfig(compile="parts")``).

Writes ``graph_launch_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import lab
from engine_profile_batched import Rows
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastLane
from hf_rstitch.fast.graphs import GraphRunner

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}  # Qwen2 7B


def host_and_device(replay, reps: int) -> dict:
    """Host ms of one ``replay()`` call with the device busy, and device ms of one replay."""
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    host = []
    torch.cuda._sleep(int(2e9))  # ~1 s of device work queued first: no launch below waits for the device
    for _ in range(reps):
        t0 = time.perf_counter()
        replay()
        host.append(time.perf_counter() - t0)  # few enough launches that the queue never fills
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        replay()
    torch.cuda.synchronize()
    device = (time.perf_counter() - t0) / reps
    idle = []  # a replay launched onto an idle device: from an event just before it to one just after
    for _ in range(reps):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        before.record()
        replay()
        after.record()
        torch.cuda.synchronize()
        idle.append(before.elapsed_time(after) / 1e3)
    host.sort()
    idle.sort()
    return {"host_ms_median": 1e3 * host[len(host) // 2], "host_ms_min": 1e3 * host[0], "device_ms": 1e3 * device,
            "from_idle_ms": 1e3 * idle[len(idle) // 2], "launch_latency_ms": 1e3 * (idle[len(idle) // 2] - device)}


def products_graph(m: int, layers: int) -> tuple:
    """A graph of ``layers`` x the 7B's four linear products, ``m`` rows each, and what it reads (kept alive)."""
    w = {k: torch.randn(n, k_, device="cuda", dtype=torch.bfloat16) * 0.01 for k, (n, k_) in SHAPES.items()}
    x = torch.randn(m, 3584, device="cuda", dtype=torch.bfloat16)

    def step():
        h = x
        for _ in range(layers):  # the same weights each layer: launch cost does not depend on which
            q = h @ w["qkv"].T
            h = q[:, :3584] @ w["o"].T
            g = h @ w["gate_up"].T
            h = g[:, :18944] @ w["down"].T
        return h

    runner = GraphRunner(torch.device("cuda"))  # as a lane captures: a warm-up run, then the recording
    runner.run("products", step)
    return runner.graphs["products"][0], (w, x, runner)


def lane_replay(model, batch: int, context: int) -> dict:
    """The fast engine's decode graph for ``batch`` rows: host and device ms of one step."""
    lane = FastLane(model, Role.LLM, model.config.vocab_size, context + 64, FastConfig(compile="parts"),
                    max_rows=batch)
    ids = torch.randint(10, model.config.vocab_size - 10, (batch, context), device="cuda")
    rows = Rows(lane, ids, 48)
    rows.steps(2, torch.cuda.synchronize)
    one_token = [g for key, (g, _) in lane.graphs.graphs.items() if key[1] == 1]  # keys: (rows, width, hidden)
    graph = one_token[0]
    return host_and_device(graph.replay, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--lane-rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--libraries", nargs="+", default=["cublas", "cublaslt"])
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    results = {"environment": lab.environment(["cuda"]), "args": vars(args), "products": [], "lane": []}
    for lib in args.libraries:
        torch.backends.cuda.preferred_blas_library(lib)
        for m in args.rows:
            graph, _inputs = products_graph(m, args.layers)
            results["products"].append({"library": lib, "rows": m, **host_and_device(graph.replay, 8)})
            print(results["products"][-1], flush=True)
            del graph, _inputs
            torch.cuda.empty_cache()
    llm, _ = lab.random_pair("qwen2", "cuda")
    for lib in args.libraries:
        torch.backends.cuda.preferred_blas_library(lib)
        for b in args.lane_rows:
            results["lane"].append({"library": lib, "rows": b, **lane_replay(llm, b, args.context)})
            print(results["lane"][-1], flush=True)
            torch.cuda.empty_cache()
    lines = [f"# CUDA graph launch: host and device ms of one replay, {results['environment']['devices'][0]}", "",
             f"torch {results['environment']['torch']}, {results['environment']['date']}. Host: median time of "
             "`CUDAGraph.replay()` with the device busy (the call never waits for it). "
             f"Products: {args.layers} x the 7B's q/k/v, o, gate/up and down products at M rows. Lane: the fast "
             f"engine's 7B one-token step (`compile=\"parts\"`), B rows at {args.context} tokens of context.", "",
             "Device: one replay of many back to back; from idle: one replay onto an idle device, event to event.", "",
             "| graph | BLAS library | rows | host ms | device ms | from idle ms | latency ms |",
             "|---|---|---|---|---|---|---|"]
    for kind in ("products", "lane"):
        for r in results[kind]:
            lines.append(f"| {kind} | {r['library']} | {r['rows']} | {r['host_ms_median']:.3f} | "
                         f"{r['device_ms']:.3f} | {r['from_idle_ms']:.3f} | {r['launch_latency_ms']:.3f} |")
    tag = results["environment"]["devices"][0].lower().replace(" ", "_")
    lab.write_result(Path(args.out_dir) / f"graph_launch_{tag}", results, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
