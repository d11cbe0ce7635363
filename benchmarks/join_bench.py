"""What joining costs a decoding batch: admission ms per step vs the number of joins, one-by-one vs batched
prefill, and a long prompt joining whole vs in chunks (``prefill_chunk``).

    PYTHONPATH=. python benchmarks/join_bench.py --out-dir $OUT                 # one GPU, ~60 s
    PYTHONPATH=. python benchmarks/join_bench.py --out-dir /tmp/j --dry-run-cpu  # tiny pair on CPU, times nothing

Random-weight Qwen2 7B (LLM) / 1.5B (SLM) in bf16 behind :class:`~hf_rstitch.serving.requests.RequestEngine`
(fast engine), routed at random (``--random-p``). ``--base`` requests decode; then ``k`` more
(``--joins``, ``--prompt`` tokens each) arrive at once and join in one step. Per ``k``, the step's admission
(``RequestEngine._admit``: layout, the lanes' prefill of the joining rows, their merge) in ms, the device
synchronised around it, median of ``--repeats``; for the join prefill one one-row call each (``one_by_one``:
:data:`hf_rstitch.fast.joins.JOIN_ROWS` = 1, the earlier engine) and batched (the default groups).

Chunks: one ``--long-prompt``-token request joins the decoding batch whole (``prefill_chunk=None``) and with
``--prefill-chunk`` tokens a step: the longest step while it joins, the steps until its first token, and the
decoding rows' tokens meanwhile.

Writes ``join_bench_<gpu>.json`` and ``.md`` (:func:`lab.write_result`); prints one compact JSON document last.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import lab  # noqa: E402

import hf_rstitch  # noqa: E402,F401
from hf_rstitch.core.policies import RandomPolicy  # noqa: E402
from hf_rstitch.serving.requests import Request, RequestEngine  # noqa: E402
from hf_rstitch.fast import FastConfig, joins  # noqa: E402


def ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def build(llm, slm, args, rows: int, chunk: int | None = None) -> RequestEngine:
    engine = FastConfig(graphs=False) if args.dry_run_cpu else "fast"
    return RequestEngine(llm, slm, max_batch=rows, policy=RandomPolicy(args.random_p, seed=0), engine=engine,
                         max_length=max(args.prompt, args.long_prompt) + args.steps + 64, prefill_chunk=chunk)


class Admissions:
    """Wall seconds (device synchronised around it) and rows joined of each ``_admit`` of ``engine``."""

    def __init__(self, engine: RequestEngine):
        self.seen: list[tuple[float, int]] = []
        original = engine._admit

        def timed():
            before = engine.running
            lab.sync()
            t0 = time.perf_counter()
            original()
            lab.sync()
            self.seen.append((time.perf_counter() - t0, engine.running - before))
        engine._admit = timed


def start_base(engine, args, vocab, gen) -> None:
    for _ in range(args.base):
        engine.submit(Request(ids(args.prompt, vocab, gen), max_new_tokens=args.steps))
    for _ in range(3):
        engine.step()


def finish(engine) -> None:
    for rid in list(engine._states):
        engine.cancel(rid)
    while engine.has_work():
        engine.step()


def join_costs(llm, slm, args, vocab) -> list[dict]:
    rows = []
    for mode, join_rows in (("one_by_one", 1), ("batched", joins.JOIN_ROWS)):
        saved, joins.JOIN_ROWS = joins.JOIN_ROWS, join_rows
        try:
            engine = build(llm, slm, args, args.base + max(args.joins))
            timer = Admissions(engine)
            gen = torch.Generator().manual_seed(1)
            for k in args.joins:
                for i in range(args.repeats + 1):  # the first round of each k captures its graphs
                    start_base(engine, args, vocab, gen)
                    timer.seen.clear()
                    for _ in range(k):
                        engine.submit(Request(ids(args.prompt, vocab, gen), max_new_tokens=args.steps))
                    while engine.running < args.base + k:
                        engine.step()
                    took = [s for s, joined in timer.seen if joined == k]
                    if i > 0:
                        rows.append({"mode": mode, "joins": k, "admit_ms": 1e3 * took[0]})
                        print(f"[join] {rows[-1]}", flush=True)
                    finish(engine)
        finally:
            joins.JOIN_ROWS = saved
        del engine
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    out = []
    for mode in ("one_by_one", "batched"):
        for k in args.joins:
            ms = [r["admit_ms"] for r in rows if r["mode"] == mode and r["joins"] == k]
            out.append({"mode": mode, "joins": k, "admit_ms": statistics.median(ms), "admit_ms_per_join":
                        statistics.median(ms) / k, "repeats": len(ms)})
            print(f"[joins] {out[-1]}", flush=True)
    return out


def chunked(llm, slm, args, vocab) -> list[dict]:
    out = []
    for chunk in (None, args.prefill_chunk):
        engine = build(llm, slm, args, args.base + 1, chunk)
        gen = torch.Generator().manual_seed(2)
        for rep in range(2):  # the first round captures the graphs
            row = long_join(engine, args, vocab, gen)
            row["prefill_chunk"] = chunk
        out.append(row)
        print(f"[chunks] {row}", flush=True)
        del engine
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def long_join(engine, args, vocab, gen) -> dict:
    """``--base`` rows decode, then one ``--long-prompt`` request joins: the steps until its first token."""
    start_base(engine, args, vocab, gen)
    engine.submit(Request(ids(args.long_prompt, vocab, gen), max_new_tokens=4, request_id="long"))
    steps, first, base_tokens = [], None, 0
    while first is None:
        lab.sync()
        t0 = time.perf_counter()
        events = engine.step()
        lab.sync()
        steps.append(time.perf_counter() - t0)
        base_tokens += sum(e.token is not None and e.request_id != "long" for e in events)
        if any(e.request_id == "long" and e.token is not None for e in events):
            first = len(steps)
    finish(engine)
    return {"long_prompt": args.long_prompt, "max_step_ms": 1e3 * max(steps),
            "median_step_ms": 1e3 * statistics.median(steps), "steps_to_first_token": first,
            "ms_to_first_token": 1e3 * sum(steps), "base_tokens_meanwhile": base_tokens}


def markdown(doc: dict) -> str:
    a = doc["args"]
    lines = [f"# Joins: admission cost per step, {doc['device']}", "",
             f"torch {doc['torch']}, transformers {doc['transformers']}, {doc['date']}; {'tiny random pair (dry run)' if a['dry_run_cpu'] else 'random Qwen2 7B / 1.5B'}, "
             f"{a['base']} rows decoding, {a['prompt']}-token prompts joining, random routing p = {a['random_p']}.", "",
             "| joins in the step | admission ms, one-by-one | admission ms, batched | ms a join, one-by-one | "
             "ms a join, batched |", "|---|---|---|---|---|"]
    by = {(r["mode"], r["joins"]): r for r in doc["joins"]}
    for k in a["joins"]:
        o, b = by[("one_by_one", k)], by[("batched", k)]
        lines.append(f"| {k} | {o['admit_ms']:.2f} | {b['admit_ms']:.2f} | {o['admit_ms_per_join']:.3f} | "
                     f"{b['admit_ms_per_join']:.3f} |")
    lines += ["", f"A {a['long_prompt']}-token prompt joining {a['base']} decoding rows:", "",
              "| prefill_chunk | longest step (ms) | median step (ms) | steps to its first token | ms to it | "
              "decoding rows' tokens meanwhile |", "|---|---|---|---|---|---|"]
    for r in doc["chunks"]:
        lines.append(f"| {r['prefill_chunk'] or 'whole'} | {r['max_step_ms']:.2f} | {r['median_step_ms']:.2f} | "
                     f"{r['steps_to_first_token']} | {r['ms_to_first_token']:.1f} | {r['base_tokens_meanwhile']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--base", type=int, default=16, help="rows decoding when the joins arrive")
    ap.add_argument("--joins", type=int, nargs="+", default=[1, 8, 32], help="requests joining in one step")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64, help="new tokens a request may write (they are cancelled)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--long-prompt", type=int, default=2048)
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--random-p", type=float, default=0.25)
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script")
    args = ap.parse_args(argv)
    if not args.dry_run_cpu and not torch.cuda.is_available():
        sys.exit("join_bench needs a CUDA device (or --dry-run-cpu)")
    llm, slm = lab.random_pair("tiny" if args.dry_run_cpu else "qwen2", "cpu" if args.dry_run_cpu else "cuda",
                               torch.float32 if args.dry_run_cpu else torch.bfloat16)
    for m in (llm, slm):
        m.generation_config.eos_token_id = None
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    env = lab.environment(["cuda"] if torch.cuda.is_available() and not args.dry_run_cpu else ["cpu"])
    doc = {"device": env["devices"][0], **env, "args": vars(args)}
    gpu = re.sub(r"[^a-z0-9]+", "_", doc["device"].lower()).strip("_") if not args.dry_run_cpu else "cpu_dry_run"
    stem = Path(args.out_dir) / f"join_bench_{gpu}"
    doc["chunks"] = []
    with torch.no_grad():
        doc["joins"] = join_costs(llm, slm, args, vocab)
        lab.write_result(stem, doc, markdown(doc))  # kept if the chunks run out of time
        doc["chunks"] = chunked(llm, slm, args, vocab)
    lab.write_result(stem, doc, markdown(doc))
    print(markdown(doc))
    print(json.dumps({"device": doc["device"], "joins": doc["joins"], "chunks": doc["chunks"]}))


if __name__ == "__main__":
    main()
