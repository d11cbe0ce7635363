"""Does it pay to let rows that wait for the LLM wait a step or two, so one LLM call serves more?

A schedule simulation, not a GPU run: a continuous batch of B rows decodes a stream of requests
with MATH-shaped routes (per request 1115 tokens, 344 of them the LLM's in runs of ~4, from
:func:`hf_rstitch.fast.routes.route`), and each step costs the per-call times measured for the
engines (``--costs``). Without deferral, every step runs the SLM if any row needs it and the LLM if
any row needs it, and every row gains a token. With deferral (``wait=k``), a row that needs the LLM
waits (gains no token) until ``min_rows`` rows need it or it has waited ``k`` steps; rows on the
SLM keep going. A hand-over costs the SLM proposal it discards, as in R-Stitch.

    PYTHONPATH=. python benchmarks/schedule_sim.py
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from lab import write_result
from hf_rstitch.fast.routes import route

# ms per call against batch rows, measured (H200, random Qwen2 7B / 1.5B, bf16):
# fast engine: engine_batched_nvidia_h200.json (LLM 4.92 / 5.58 / 6.57 / 7.64 ms at B = 1 / 8 / 32 / 64;
# SLM 2.39 ms at B = 1, scaled with the LLM's growth); eager lanes: host-bound, ~20 ms (7B) / ~15 ms
# (1.5B) a call at any B up to 64 (docs/howto/batching.md).
FAST_LLM = {1: 4.92, 8: 5.58, 32: 6.57, 64: 7.64}
COSTS = {
    "fast": lambda b: (2.39 * _interp(FAST_LLM, b) / FAST_LLM[1], _interp(FAST_LLM, b)),
    "eager": lambda b: (15.0, 20.0),
}


def _interp(table: dict[int, float], b: int) -> float:
    keys = sorted(table)
    lo = max(k for k in keys if k <= b)
    hi = min((k for k in keys if k >= b), default=keys[-1])
    return table[lo] if hi == lo else table[lo] + (table[hi] - table[lo]) * (b - lo) / (hi - lo)


@dataclass
class Row:
    roles: list[str]
    at: int = 0  # next token
    waited: int = 0
    start_ms: float = 0.0


def simulate(batch: int, n_requests: int, cost, wait: int, min_rows: int, seed: int = 0) -> dict:
    routes = [route(1115, 344, 4.0, seed=seed * 100000 + i) for i in range(n_requests)]
    queue, rows, clock, latencies = list(routes), [], 0.0, []
    llm_calls = slm_calls = steps = 0
    while queue or rows:
        while queue and len(rows) < batch:
            rows.append(Row(queue.pop(0), start_ms=clock))
        need_llm = [r for r in rows if r.roles[r.at] == "llm"]
        on_slm = [r for r in rows if r.roles[r.at] == "slm"]
        # the SLM runs for its rows and for rows just handed over (the proposal it discards)
        handing = [r for r in need_llm if r.waited == 0 and (r.at == 0 or r.roles[r.at - 1] == "slm")]
        serve = bool(need_llm) and (wait == 0 or not on_slm or len(need_llm) >= min_rows
                                    or any(r.waited >= wait for r in need_llm))
        c_slm, c_llm = cost(len(rows))
        clock += (c_slm if (on_slm or handing) else 0.0) + (c_llm if serve else 0.0)
        slm_calls += bool(on_slm or handing)
        llm_calls += serve
        steps += 1
        for r in need_llm:
            r.waited = 0 if serve else r.waited + 1
        for r in on_slm + (need_llm if serve else []):
            r.at += 1
        for r in [r for r in rows if r.at == len(r.roles)]:
            latencies.append(clock - r.start_ms)
            rows.remove(r)
    tokens = n_requests * 1115
    return {"batch": batch, "wait": wait, "min_rows": min_rows, "seconds": clock / 1e3, "tokens_per_s": tokens / clock * 1e3,
            "mean_latency_s": sum(latencies) / len(latencies) / 1e3, "steps": steps, "llm_calls": llm_calls,
            "slm_calls": slm_calls}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 32, 64])
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--waits", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--out", default="benchmarks/results/schedule_sim")
    args = p.parse_args()
    rows = []
    for engine, cost in COSTS.items():
        for b in args.batches:
            base = None
            for k in args.waits:
                for m in ([1] if k == 0 else sorted({2, max(2, b // 4)})):
                    r = {"engine": engine, **simulate(b, max(args.requests, 2 * b), cost, k, m)}
                    base = base or r
                    r["throughput_vs_no_wait"] = r["tokens_per_s"] / base["tokens_per_s"]
                    r["latency_vs_no_wait"] = r["mean_latency_s"] / base["mean_latency_s"]
                    rows.append(r)
    head = ["engine", "batch", "wait", "min_rows", "tokens_per_s", "throughput_vs_no_wait", "mean_latency_s",
            "latency_vs_no_wait", "llm_calls", "slm_calls"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[h]:.3g}" if isinstance(r[h], float) else str(r[h]) for h in head) + " |")
    table = "\n".join(lines)
    print(table)
    write_result(args.out, {"rows": rows, "costs_ms": {"fast_llm": FAST_LLM, "fast_slm_b1": 2.39,
                                                        "eager": {"slm": 15.0, "llm": 20.0}}}, table)


if __name__ == "__main__":
    main()
