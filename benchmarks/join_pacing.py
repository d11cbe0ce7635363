"""Join pacing on the CPU: joins a step, throughput and first-token time with and without ``--join-wait``.

    PYTHONPATH=. python benchmarks/join_pacing.py                      # ~2.5 min; writes join_pacing_cpu.{json,md}

Two engines, each alone in the serving benchmarks' closed loop (:func:`serve_alone.engine_closed_loop`: ``c``
requests in flight, a new one submitted as one ends), requests of the reasoning benchmark's LLM-alone lengths
(``serve_reasoning.shapes``):

* the stand-in (:mod:`serve_standin`, no model) at the H200's LLM-alone step at 256 clients
  (``benchmarks/results/serve_reasoning_nvidia_h200.md``: 16 ms a step without joins at 256 rows, 2 ms of it host
  Python) plus a join cost at every step that admits requests (``--join-ms``: a weight read of the 7B and the 1.5B
  and their host work, ~5 ms for the ~2 joiners a step there), admitted by the request engine's own scheduler: a
  projection of what pacing saves on the GPU, where a join call costs about as much whatever its rows;
* the request engine itself over a tiny random pair on the CPU's eager lanes (``rstitch serve``'s engine on a CPU),
  whose join calls cost a forward of each model: joins a step from the engine's ``stats``, and the phase table's
  share of a step spent in joins (:class:`serve_alone.Phases`).

A request's tokens do not depend on when it joins (``tests/batching/test_join_pacing.py``): only timing changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lab  # noqa: E402
from serve_alone import engine_closed_loop  # noqa: E402
from serve_reasoning import prompts, shapes  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "join_pacing_cpu"


def standin(max_batch: int, pacing: dict, join_ms: tuple[float, float]):
    from serve_standin import StandinEngine, StandinTiming

    from hf_rstitch.core.scheduling import JoinPacing

    return StandinEngine(max_batch, timing=StandinTiming(join_ms=join_ms[0], join_row_ms=join_ms[1]),
                         pacing=JoinPacing(**pacing))


def tiny(pair, max_batch: int, pacing: dict):
    from hf_rstitch.batching.requests import RequestEngine

    return RequestEngine.of(*pair, threshold=0.5, max_batch=max_batch, max_waiting=max_batch, engine="default",
                            max_length=512, **pacing)


def level(engine, lengths: list[int], prompt: int, clients: int, args) -> dict:
    """One closed-loop level; the engine's join counts over it (warm-up included)."""
    before = dict(engine.stats)
    out = engine_closed_loop(engine, {"lengths": lengths, "method": "llm_only"}, prompts(len(lengths), prompt),
                             clients, args.warmup_s, args.window_s)
    d = {k: engine.stats[k] - before.get(k, 0) for k in ("steps", "joins", "joined", "paced")}
    phases = out.pop("phases", None) or {}
    row = {"clients": clients, "steps_per_s": out["steps_per_s"], "tokens_per_s": out["tokens_per_s"],
           "requests_per_s": out["requests_per_s"], "ttft_p50_s": out["ttft_p50_s"], "p50_s": out["p50_s"],
           "p99_s": out["p99_s"], "joins_per_step": d["joins"] / max(1, d["steps"]),
           "joiners_per_join": d["joined"] / max(1, d["joins"]), "paced_steps": d["paced"], "errors": out["errors"]}
    if "joins" in phases:
        row["joins_share"] = phases["joins"]["share"]
    return row


def standin_share(row: dict, join_ms: tuple[float, float]) -> float:
    """The stand-in's share of a step spent joining, by its timing model (not the busy CPU's wall): join ms a step
    over the step's ms with every row running."""
    from serve_standin import StandinTiming

    per_step = row["joins_per_step"] * (join_ms[0] + join_ms[1] * row["joiners_per_join"])
    return per_step / (1e3 * StandinTiming().step_s(row["clients"]) + per_step)


def run(args) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    shape = shapes(0.05)
    rows = []
    for clients in args.standin_levels:
        for wait in args.waits:
            pacing = {"join_wait": wait, "join_group": args.join_group}
            r = level(standin(clients, pacing, args.join_ms), shape["llm_only"], shape["prompt"], clients, args)
            rows.append({"engine": "stand-in (H200-like)", **pacing, **r, "joins_share": standin_share(r, args.join_ms)})
            print(rows[-1], flush=True)
    pair = lab.random_pair("tiny", "cpu", torch.float32)
    small = shapes(args.tiny_scale)
    for clients in args.tiny_levels:
        for wait in args.waits:
            pacing = {"join_wait": wait, "join_group": args.join_group}
            r = level(tiny(pair, clients, pacing), small["llm_only"], small["prompt"], clients, args)
            rows.append({"engine": "tiny pair, eager lanes", **pacing, **r})
            print(rows[-1], flush=True)
    return rows


def markdown(rows: list[dict], args) -> str:
    lines = ["# Join pacing on the CPU: joins a step, throughput and first tokens", "",
             f"Closed loop of the engine alone, {args.warmup_s} s warm-up then a {args.window_s} s window a level; "
             f"requests of the reasoning benchmark's LLM-alone lengths (stand-in: scale 0.05, ~138 tokens; tiny pair: "
             f"scale {args.tiny_scale}). Stand-in: 6 + 0.04 x rows ms a step (2 of it host Python), a step that "
             f"admits requests {args.join_ms[0]} + {args.join_ms[1]} x joiners ms more; joins share: that cost a step "
             "over the model's step (every row running, joins included). Tiny pair: the request engine on eager CPU lanes (a join: a forward of each model); joins "
             "share: the phase table's (admission and the batch's moves, host time). join_group "
             f"{args.join_group}. On a busy shared 2-core CPU (other jobs running) steps/s, tokens/s and latencies "
             "are not comparable between rows; joins a step, joiners a join and the stand-in's joins share are "
             "(counts, and its timing model).", "",
             "| engine | clients | join_wait | joins a step | joiners a join | joins share | steps/s | tokens/s | "
             "TTFT p50 (s) | p50 (s) | p99 (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=3: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['engine']} | {r['clients']} | {r['join_wait']} | {f(r['joins_per_step'], 2)} | "
                     f"{f(r['joiners_per_join'], 1)} | {f(r.get('joins_share'), 2)} | {f(r['steps_per_s'], 1)} | "
                     f"{f(r['tokens_per_s'], 0)} | {f(r['ttft_p50_s'])} | {f(r['p50_s'])} | {f(r['p99_s'])} |")
    lines += ["", "On a GPU, the same knob: `benchmarks/serve_reasoning.py --join-wait K --join-group M`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waits", type=int, nargs="+", default=[0, 4, 8], help="join_wait values (0: at once)")
    ap.add_argument("--join-group", type=int, default=8)
    ap.add_argument("--join-ms", type=float, nargs=2, default=(4.0, 0.5), metavar=("JOIN", "JOIN_ROW"),
                    help="the stand-in's join cost: JOIN + JOIN_ROW x joiners ms a step that admits requests")
    ap.add_argument("--standin-levels", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--tiny-levels", type=int, nargs="+", default=[32])
    ap.add_argument("--tiny-scale", type=float, default=0.01, help="the tiny pair's request lengths (x MATH's)")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=6.0)
    ap.add_argument("--out", default=str(RESULT))
    args = ap.parse_args(argv)
    rows = run(args)
    text = markdown(rows, args)
    kept = {k: v for k, v in vars(args).items() if k != "out"}
    lab.write_result(args.out, {**lab.environment(["cpu"]), "args": kept, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
