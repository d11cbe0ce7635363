"""Does waiting for the LLM pay? The request engine with ``schedule="now"`` against ``"gather:K[:M]"``, one GPU.

    PYTHONPATH=.:benchmarks python benchmarks/engine_schedule.py --out-dir $OUT [--batches 4 8 32 64]

A stream of requests (``--per-batch`` x B of them, MATH-shaped routes: per request ``--scale`` of
344 LLM + 771 SLM tokens in LLM runs of ~4, ``hf_rstitch.fast.routes.route``, a seed per request)
goes through one :class:`~hf_rstitch.engine.RequestEngine` of B rows on the fast engine (random
Qwen2 7B LLM / 1.5B SLM, bf16, every graph captured before the timed runs), once per schedule.
The routes are replayed per request (its own token index), so every schedule writes the same
tokens with the same models; what changes is how many LLM calls run and when rows get tokens.

Writes ``engine_schedule_<gpu>.json`` (``rows``: batch, schedule, seconds, tokens/s, mean request
latency, LLM / SLM calls, held row-steps, requests whose tokens equal the ``now`` run) and ``.md``;
``--plot FILE.json`` draws the throughput chart from a results file (no GPU).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch

import lab
from engine_bench import Budget
from hf_rstitch.engine.requests import HOLD_TRIM, Request, RequestEngine
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.routes import route

MATH = {"llm_tokens": 344, "slm_tokens": 771}  # paper, MATH, 7B pair: per problem, stitched


class RoutesByRequest:
    """Replays each request's route at its own token index (read from the engine's rows)."""

    needs_hidden = False

    def __init__(self, routes: dict[str, list[str]]):
        self.routes, self.engine = routes, None

    def reset(self) -> None:
        pass

    def _llm(self, ahead: int) -> torch.Tensor:
        out = []
        for row in self.engine._rows:  # lane order == the step's rows
            r = self.routes[row.request.request_id]
            out.append(r[min(row.trace.n_tokens + ahead, len(r) - 1)] == "llm")
        return torch.tensor(out)

    def hand_to_llm(self, step):
        return self._llm(0)

    def hand_to_slm(self, step):
        return ~self._llm(1)


def run(llm, slm, fast, batch: int, schedule: str, args, vocab: int) -> tuple[dict, dict[str, list[int]]]:
    n_req = args.per_batch * batch
    llm_n, slm_n = round(MATH["llm_tokens"] * args.scale), round(MATH["slm_tokens"] * args.scale)
    routes = {str(i): route(llm_n + slm_n, llm_n, 4.0, seed=1000 + i) for i in range(n_req)}
    policy = RoutesByRequest(routes)
    engine = RequestEngine(llm, slm, max_batch=batch, policy=policy, engine=fast or "default", schedule=schedule,
                           max_length=args.prompt + llm_n + slm_n + 8)
    policy.engine = engine
    g = torch.Generator().manual_seed(batch)
    for i in range(n_req):
        ids = torch.randint(3, vocab, (args.prompt,), generator=g).tolist()
        engine.submit(Request(ids, max_new_tokens=llm_n + slm_n, eos_token_id=[], request_id=str(i)))
    tokens: dict[str, list[int]] = {}
    start: dict[str, float] = {}
    latency = []
    lab.sync(llm.device)
    t0 = time.perf_counter()
    while engine.has_work():
        now = time.perf_counter()
        for e in engine.step():
            start.setdefault(e.request_id, now)
            if e.token is not None:
                tokens.setdefault(e.request_id, []).append(e.token)
            if e.finished:
                latency.append(time.perf_counter() - start[e.request_id])
    seconds = time.perf_counter() - t0
    n_tokens = sum(len(t) for t in tokens.values())
    row = {"engine": "fast" if fast else "eager", "batch": batch, "schedule": schedule, "requests": n_req, "tokens": n_tokens, "seconds": seconds,
           "tokens_per_s": n_tokens / seconds, "mean_latency_s": sum(latency) / len(latency), **engine.stats}
    return row, tokens


def markdown(res: dict) -> str:
    env = res["environment"]
    lines = [f"# Waiting for the LLM: request engine, fast engine, random Qwen2 7B / 1.5B bf16, {env['devices'][0]}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}; fast engine "
             f"`{res['config']}`. Per request: {res['args']['prompt']}-token prompt, "
             f"{round(MATH['llm_tokens'] * res['args']['scale'])} LLM + {round(MATH['slm_tokens'] * res['args']['scale'])} "
             f"SLM tokens (LLM runs of ~4), {res['args']['per_batch']} x B requests through B rows.", "",
             "| engine | B | schedule | tokens/s | vs now | mean latency (s) | vs now | LLM calls | SLM calls | held row-steps | "
             "same tokens as now |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {}
    for r in res["rows"]:
        if r["schedule"] == "now":  # the first "now" run of a batch is the reference; a repeat shows the noise
            base.setdefault((r.get("engine", "fast"), r["batch"]), r)
    for r in res["rows"]:
        b = base.get((r.get("engine", "fast"), r["batch"]))
        tp = f"{r['tokens_per_s'] / b['tokens_per_s']:.3f}x" if b else "-"
        lat = f"{r['mean_latency_s'] / b['mean_latency_s']:.3f}x" if b else "-"
        lines.append(f"| {r.get('engine', 'fast')} | {r['batch']} | {r['schedule']} | {r['tokens_per_s']:.0f} | {tp} | {r['mean_latency_s']:.2f} | "
                     f"{lat} | {r['llm_calls']} | {r['slm_calls']} | {r['held']} | "
                     f"{r.get('same_tokens', '-')}/{r['requests']} |")
    if res.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(res["skipped"])]
    lines += ["", f"Regenerate: `{res['command']}`"]
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(path.read_text())
    key = lambda r: (r.get("engine", "fast"), r["batch"])  # noqa: E731
    base = {}
    for r in res["rows"]:
        if r["schedule"] == "now":
            base.setdefault(key(r), r["tokens_per_s"])
    schedules = list(dict.fromkeys(r["schedule"] for r in res["rows"]))  # "now" again: the repeat's noise
    groups = list(base)
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    width = 0.8 / max(len(schedules), 1)
    for k, s in enumerate(schedules):
        got = {key(r): r["tokens_per_s"] / base[key(r)] for r in res["rows"] if r["schedule"] == s and key(r) in base}
        xs = [i + (k - (len(schedules) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [got.get(g, float("nan")) for g in groups], width, label="now (repeat)" if s == "now" else s)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(groups)), [f"{e}\nB={b}" for e, b in groups])
    ax.set_ylabel("throughput vs schedule 'now'")
    ax.set_ylim(0.5, max(1.2, ax.get_ylim()[1]))
    ax.set_title(f"Waiting for the LLM ({res['environment']['devices'][0]})", fontsize=10)
    ax.legend(fontsize=8)
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 8, 32, 64])
    ap.add_argument("--schedules", nargs="+", default=["now", "gather:2", "gather:4"])
    ap.add_argument("--per-batch", type=int, default=2, help="requests per row of the batch")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--scale", type=float, default=0.5, help="fraction of the MATH token counts per request")
    ap.add_argument("--compile", default="parts", help="FastConfig(compile=...): parts, decode, none")
    ap.add_argument("--eager-batches", type=int, nargs="*", default=[], help="also run these on the eager lanes")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--tiny-cpu", action="store_true", help="tiny models on CPU without graphs: checks the script")
    ap.add_argument("--probe", action="store_true", help="time the pieces of a hold (B = 64) before the runs")
    ap.add_argument("--plot", type=Path, help="draw the chart of an existing results JSON and exit")
    args = ap.parse_args()
    if args.plot:
        print(plot(args.plot))
        return
    device = "cpu" if args.tiny_cpu else "cuda"
    budget = Budget(args.budget_s)
    llm, slm = lab.random_pair("tiny" if args.tiny_cpu else "qwen2", device, getattr(torch, args.dtype))
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    config = FastConfig(compile=None if args.compile == "none" else args.compile, graphs=False if args.tiny_cpu else None)
    # room for the padding held rows leave (HOLD_TRIM): one set of lanes serves every run, never rebuilt
    fast = FastEngine(config, capacity=args.prompt + round(1115 * args.scale) + 16 + HOLD_TRIM, max_batch=max(args.batches))
    res = {"environment": lab.environment([device]), "args": {k: str(v) if isinstance(v, Path) else v
                                                              for k, v in vars(args).items()},
           "config": repr(config), "rows": [], "skipped": [], "command": lab.command()}
    gpu = re.sub(r"[^a-z0-9]+", "_", res["environment"]["devices"][0].lower()).strip("_")
    stem = Path(args.out_dir) / f"engine_schedule_{gpu}"
    with torch.no_grad():
        if args.probe:
            res["probe_s"] = probe(llm, slm, args)
        t0 = time.perf_counter()
        run(llm, slm, fast, max(args.batches), "now", argparse.Namespace(**{**vars(args), "per_batch": 1, "scale": 0.02}),
            vocab)  # builds the lanes (and compiles)
        warm = sum(lane.warm_up() for lane in fast._lanes.values())  # every batch and length bucket
        res["warm_up_s"] = {"first_call": time.perf_counter() - t0 - warm, "every_bucket": warm}
        print(f"[warm] {res['warm_up_s']}", flush=True)
        runs = [(fast, b) for b in args.batches] + [(None, b) for b in args.eager_batches]
        short = argparse.Namespace(**{**vars(args), "per_batch": 1, "scale": 0.05})
        for engine, batch in runs:
            base = None
            for schedule in args.schedules:  # untimed: first-use costs (allocator, eager kernels) stay out
                run(llm, slm, engine, batch, schedule, short, vocab)
            for schedule in args.schedules:
                if not budget.allows(0):
                    res["skipped"].append(f"{'fast' if engine else 'eager'} B={batch} {schedule}: time budget")
                    continue
                row, tokens = run(llm, slm, engine, batch, schedule, args, vocab)
                if schedule == "now" and base is None:
                    base = tokens
                elif base is not None:
                    row["same_tokens"] = sum(tokens[k] == base[k] for k in base)
                res["rows"].append(row)
                print(f"[{row['engine']} B={batch} {schedule}] {row}", flush=True)
                lab.write_result(stem, res, markdown(res))
    lab.write_result(stem, res, markdown(res))
    print(markdown(res))


def probe(llm, slm, args) -> dict:
    """Seconds of the pieces a held row adds, at B = 64 with 700 columns seen: hold_rows, trim_left, and
    one call of each catch-up width (a held row's next LLM call reads one column more)."""
    from hf_rstitch import Role
    from hf_rstitch.fast import FastLane

    out = {}
    for role, model in ((Role.LLM, llm), (Role.SLM, slm)):
        lane = FastLane(model, role, min(llm.config.vocab_size, slm.config.vocab_size), capacity=1024,
                        config=FastConfig(compile=None if args.compile == "none" else args.compile), max_rows=64)
        seq = torch.randint(3, 200, (64, 700), device=model.device)
        mask = torch.ones_like(seq)
        every, none = torch.ones(64, dtype=torch.bool), torch.zeros(64, dtype=torch.bool)
        lane.advance(seq, mask, every, none)
        t = {}
        for k in (1, 4, 16):
            t[f"hold_rows_{k}"] = lab.timed(lambda: lane.hold_rows(list(range(k))), model.device, repeats=5)[0]
        lane.pad_left(1)
        seq, mask = torch.nn.functional.pad(seq, (1, 0)), torch.nn.functional.pad(mask, (1, 0))
        t["trim_left_1"] = lab.timed(lambda: lane.trim_left(1), model.device)[0]
        seq, mask = seq[:, 1:], mask[:, 1:]
        for width in (1, 2, 4, 1, 2, 4):
            seq = torch.cat([seq, seq[:, -width:]], 1)
            mask = torch.ones_like(seq)
            lane.advance(seq, mask, every, none)  # captures the bucket the first time
            seq = torch.cat([seq, seq[:, -width:]], 1)
            mask = torch.ones_like(seq)
            t[f"call_width_{width}"] = lab.timed(lambda: lane.advance(seq, mask, every, none), model.device)[0]
        out[str(role)] = t
        print(f"[probe {role}] {t}", flush=True)
        del lane
    return out


if __name__ == "__main__":
    main()
