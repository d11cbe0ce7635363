"""Where the host spends a fast-engine generation: cProfile of LLM-only decoding (one GPU, B = 1).

    PYTHONPATH=. python benchmarks/engine_host_profile.py --out $OUT/host_profile.json   # CUDA, ~1 min
    PYTHONPATH=. python benchmarks/engine_host_profile.py --cpu-smoke --out /tmp/h.json  # checks the script

``generate(..., stitch_engine=engine)`` cost ~0.4-1.4 ms per token more than the same lane
driven by a bare loop (benchmarks/results/engine_nvidia_h200*.json). This script says where:
it decodes ``--new`` tokens with a replayed all-LLM route through ``generate`` under cProfile
(graphs already captured), and reports per token the wall time, the bare lane's time, and the
host functions with the most own time -- a device wait shows up as the call that synchronises
(``.cpu()`` / ``.item()`` / ``.tolist()``), host work as everything else.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import pstats
import time
from pathlib import Path

import torch
import transformers

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import FastConfig, FastEngine
from lab import sync


def build(cpu: bool):
    """(llm, slm): random Qwen2 7B + 1.5B shapes on the GPU, engine_bench's tiny pair for the CPU smoke."""
    from engine_bench import tiny_pair  # noqa: E402  (this folder is on the path when run as a script)
    from hf_rstitch.latency.profiler import random_qwen2

    if not cpu:
        return random_qwen2("7b"), random_qwen2("1.5b")
    pair = tiny_pair()
    return pair["llm"], pair["slm"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--compile", default=None, choices=[None, "parts", "decode", "all"])
    ap.add_argument("--route", default="llm", choices=["llm", "slm"], help="which model writes every token")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    llm, slm = build(args.cpu_smoke)
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    dev = llm.device
    ids = torch.randint(1, slm.config.vocab_size, (1, 128), device=dev)  # no pad id: no mask holes
    engine = FastEngine(FastConfig(compile=args.compile, graphs=not args.cpu_smoke), capacity=1024)
    def gen(n):
        sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy([args.route] * n), stitch_engine=engine,
                         max_new_tokens=n, do_sample=False)
        sync(dev)
        return time.perf_counter() - t0

    gen(16), gen(args.new)  # capture every graph
    plain = gen(args.new)
    prof = cProfile.Profile()
    prof.enable()
    profiled = gen(args.new)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "own_ms_per_token": 1e3 * tt / args.new,
                     "cum_ms_per_token": 1e3 * ct / args.new})
    rows.sort(key=lambda r: -r["own_ms_per_token"])
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu smoke", "torch": torch.__version__,
           "transformers": transformers.__version__, "compile": args.compile, "route": args.route,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "new_tokens": args.new, "ms_per_token": 1e3 * plain / args.new,
           "ms_per_token_under_cprofile": 1e3 * profiled / args.new, "top_own": rows[:40],
           "top_cum": sorted(rows, key=lambda r: -r["cum_ms_per_token"])[:40]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"{res['device']}: {res['ms_per_token']:.3f} ms/token ({res['ms_per_token_under_cprofile']:.3f} profiled)")
    for r in rows[:25]:
        print(f"{r['own_ms_per_token']:8.4f} own {r['cum_ms_per_token']:8.4f} cum {r['calls']:7d}  {r['function']}")


if __name__ == "__main__":
    main()
