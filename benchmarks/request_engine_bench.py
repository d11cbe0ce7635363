"""The request engine's cost per step, with rows joining and leaving, against a batch that only decodes.

    PYTHONPATH=.:benchmarks python benchmarks/request_engine_bench.py --out-dir $OUT      # one GPU, ~2 min

Random-weight Qwen2 7B (LLM) / 1.5B (SLM) in bf16 behind :class:`~hf_rstitch.serving.requests.RequestEngine`
(fast engine), routed at random (``--random-p``: each SLM step goes to the LLM with that probability and
comes back after one token; random weights make entropy routing meaningless). Two loads of 128-token
prompts, all submitted at once, ``--batch`` rows:

* ``steady``: ``--batch`` requests of ``--tokens`` tokens each: one wave, no row joins mid-way;
* ``stream``: ``--waves`` x ``--batch`` requests of 0.5x-1.5x ``--tokens`` tokens (seeded): rows finish at
  different steps and waiting requests take their places, as in serving.

For each it reports wall seconds, tokens, engine steps, ms per step, and where the time goes: by
default the host's (cProfile, cumulative ms per step of the engine's verbs: joins and their prefill,
trims, the step); with ``--phases`` the host's and the device's per phase of a step, no profiler:

    PYTHONPATH=.:benchmarks python benchmarks/request_engine_bench.py --out-dir $OUT --phases

A phase's device time is read from CUDA events recorded when it starts and ends on the host: the device's
work queued meanwhile, from when the device reached it (so also time it waited for the host). Writes
``request_engine_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import pstats
import sys
import time
from pathlib import Path

import torch

import hf_rstitch  # noqa: F401
from hf_rstitch.core.policies import RandomPolicy
from hf_rstitch.serving import requests as requests_mod
from hf_rstitch.serving.requests import Request, RequestEngine

WATCH = ("requests.py:step", "requests.py:_admit", "lane_rows.py:add_rows", "lane_rows.py:_prefill_rows",
         "lane_rows.py:pad_left", "lane_rows.py:trim_left", "lane_rows.py:_shift", "requests.py:_drop",
         "lane.py:keep_rows", "step.py:run_step", "loop.py:run_ahead", "joins.py:prefill_rows",
         "admission.py:step", "Event.synchronize")


def models(args):
    if args.dry_run_cpu:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        def tiny(layers, seed):
            torch.manual_seed(seed)
            cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
            return Qwen2ForCausalLM(cfg).eval()
        return tiny(3, 0), tiny(2, 1)
    from hf_rstitch.latency.profiler import random_qwen2

    dtype = getattr(torch, args.dtype)
    return random_qwen2("7b", dtype, "cuda", seed=0), random_qwen2("1.5b", dtype, "cuda", seed=1)


def requests(n: int, tokens: list[int], prompt: int, vocab: int, seed: int) -> list[Request]:
    gen = torch.Generator().manual_seed(seed)
    return [Request(torch.randint(0, vocab, (prompt,), generator=gen).tolist(), max_new_tokens=t) for t in tokens[:n]]


def drive(engine: RequestEngine, reqs: list[Request]) -> tuple[float, int, int]:
    """Submit ``reqs`` at once and step until done: (wall seconds, completion tokens, steps)."""
    for r in reqs:
        engine.submit(r)
    steps, tokens = 0, 0
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    while engine.has_work():
        for ev in engine.step():
            tokens += 1 if getattr(ev, "token", None) is not None else 0
        steps += 1
    sync()
    return time.perf_counter() - start, tokens, steps


def watched(prof: cProfile.Profile, steps: int) -> dict:
    stats = pstats.Stats(prof)
    out = {}
    for (path, line, name), (_, calls, _, cum, _) in stats.stats.items():
        key = f"{Path(path).name}:{name}"
        for w in WATCH:
            if key == w or (w == "Event.synchronize" and "synchronize" in name and "Event" in name):
                got = out.setdefault(w, {"calls": 0, "cum_ms_per_step": 0.0})
                got["calls"] += calls
                got["cum_ms_per_step"] += 1e3 * cum / max(steps, 1)
    return out


# phases of a step (--phases): RequestEngine methods and the functions requests.py calls, by name
PHASES = {"step": (RequestEngine, "step"), "admit (joins, their prefill)": (RequestEngine, "_admit"),
          "drop (leaves, trims)": (RequestEngine, "_drop"), "run_step": (requests_mod, "run_step"),
          "run_ahead": (requests_mod, "run_ahead")}


class Phases:
    """Host seconds and device events around each call of the :data:`PHASES` while installed."""

    def __init__(self):
        self.calls = {name: [] for name in PHASES}  # name -> [(host s, start event, end event)]
        self.saved = []

    def install(self) -> None:
        for name, (owner, attr) in PHASES.items():
            original = getattr(owner, attr)
            self.saved.append((owner, attr, original))
            setattr(owner, attr, self._timed(name, original))

    def remove(self) -> None:
        for owner, attr, original in reversed(self.saved):
            setattr(owner, attr, original)
        self.saved.clear()

    def _timed(self, name, fn):
        cuda = torch.cuda.is_available()

        def timed(*args, **kwargs):
            start = torch.cuda.Event(enable_timing=True) if cuda else None
            if start is not None:
                start.record()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                host = time.perf_counter() - t0
                end = torch.cuda.Event(enable_timing=True) if cuda else None
                if end is not None:
                    end.record()
                self.calls[name].append((host, start, end))
        return timed

    def summary(self, steps: int) -> dict:
        """Per phase: calls, host ms a step, device ms a step (events; device synchronised first)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out = {}
        for name, calls in self.calls.items():
            device = sum(s.elapsed_time(e) for _, s, e in calls) if calls and calls[0][1] is not None else 0.0
            out[name] = {"calls": len(calls), "host_ms_per_step": 1e3 * sum(h for h, _, _ in calls) / max(steps, 1),
                         "device_ms_per_step": device / max(steps, 1)}
        return out


def run_load(name, engine, reqs, profile: bool, phases: bool = False) -> dict:
    prof = cProfile.Profile() if profile and not phases else None
    timer = Phases() if phases else None
    if prof:
        prof.enable()
    if timer:
        timer.install()
    try:
        wall, tokens, steps = drive(engine, reqs)
    finally:
        if timer:
            timer.remove()
    if prof:
        prof.disable()
    row = {"load": name, "requests": len(reqs), "wall_s": wall, "tokens": tokens, "steps": steps,
           "ms_per_step": 1e3 * wall / max(steps, 1), "tokens_per_s": tokens / wall,
           "mean_rows_per_step": tokens / max(steps, 1), "stats": dict(engine.stats)}
    if prof:
        row["host_ms_per_step"] = watched(prof, steps)
    if timer:
        row["phases"] = timer.summary(steps)
    print(f"[{name}] {json.dumps({k: v for k, v in row.items() if k != 'host_ms_per_step'})}", flush=True)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--batch", type=int, default=32, help="rows of the running batch (max_batch)")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens a request (mean, in the stream)")
    ap.add_argument("--waves", type=int, default=4, help="stream: requests = waves x batch")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--random-p", type=float, default=0.25)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-profile", action="store_true", help="time without cProfile (it adds host time)")
    ap.add_argument("--phases", action="store_true",
                    help="instead of cProfile, host and device ms a step per phase (joins, leaves, the step's calls)")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="RequestEngine(prefill_chunk=...): joining prompts read this many tokens a step (default: whole)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script")
    args = ap.parse_args(argv)
    if not args.dry_run_cpu and not torch.cuda.is_available():
        sys.exit("request_engine_bench needs a CUDA device (or --dry-run-cpu)")
    llm, slm = models(args)
    for m in (llm, slm):
        m.generation_config.eos_token_id = None
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    engine = RequestEngine(llm, slm, max_batch=args.batch, policy=RandomPolicy(args.random_p),
                           engine="default" if args.dry_run_cpu else "fast",
                           max_length=args.prompt + 2 * args.tokens + 16, prefill_chunk=args.prefill_chunk)
    t0 = time.perf_counter()
    drive(engine, requests(2 * args.batch, [8 + (i % 9) for i in range(2 * args.batch)], args.prompt, vocab, 7))
    warm_s = time.perf_counter() - t0  # graphs for the batch buckets, joins included
    gen = torch.Generator().manual_seed(3)
    n = args.waves * args.batch
    lengths = (args.tokens * (0.5 + torch.rand(n, generator=gen))).round().long().tolist()
    rows = [run_load("steady", engine, requests(args.batch, [args.tokens] * args.batch, args.prompt, vocab, 1),
                     not args.no_profile, args.phases),
            run_load("stream", engine, requests(n, lengths, args.prompt, vocab, 2), not args.no_profile, args.phases)]
    name = "cpu" if args.dry_run_cpu else torch.cuda.get_device_name()
    import transformers

    meta = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "args": vars(args), "warm_up_s": warm_s}
    gpu = name.lower().replace(" ", "_")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"request_engine_{gpu}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [f"# Request engine, rows joining and leaving: random Qwen2 7B / 1.5B, {args.dtype}, {name}", "",
             f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}; max batch {args.batch}, "
             f"{args.prompt}-token prompts, random routing p = {args.random_p}; "
             f"{'phases timed' if args.phases else 'under cProfile' if not args.no_profile else 'no profiler'}.", "",
             "| load | requests | steps | rows a step | wall (s) | ms/step | tokens/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['load']} | {r['requests']} | {r['steps']} | {r['mean_rows_per_step']:.1f} | "
                     f"{r['wall_s']:.2f} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} |")
    if args.phases:
        lines += ["", "Per phase, ms a step, host / device (device: CUDA events around each call; the step's "
                  "total includes the others):", "",
                  "| phase | " + " | ".join(r["load"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
        for ph in PHASES:
            cells = [f"{r['phases'][ph]['host_ms_per_step']:.2f} / {r['phases'][ph]['device_ms_per_step']:.2f}"
                     for r in rows]
            lines.append(f"| {ph} | " + " | ".join(cells) + " |")
    elif not args.no_profile:
        lines += ["", "Host time, cumulative ms a step (cProfile):", "",
                  "| function | " + " | ".join(r["load"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
        for w in WATCH:
            cells = [f"{r['host_ms_per_step'].get(w, {}).get('cum_ms_per_step', 0):.2f}" for r in rows]
            lines.append(f"| `{w}` | " + " | ".join(cells) + " |")
    lines += ["", f"Regenerate: `PYTHONPATH=.:benchmarks python {meta['command']}`"]
    (out / f"request_engine_{gpu}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
