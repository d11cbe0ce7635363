"""How long does a fresh process wait before the fast engine decodes, with and without torch's compile caches?

    PYTHONPATH=.:benchmarks python benchmarks/engine_warmup.py --out-dir $OUT [--variants parts decode]

For each ``FastConfig(compile=...)`` variant, two child processes run one after the other with the
same, initially empty, compile caches (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` in a fresh
folder): the first compiles cold, the second finds the first one's FX-graph / AOTAutograd / Triton
caches on disk (torch's defaults; nothing of hf-rstitch's). Each child builds the random Qwen2 7B /
1.5B pair (bf16), times its first stitched ``generate`` at B = 1 (lanes built, GEMV tuned, graphs of the
buckets it meets captured and compiled), then ``warm_up`` of every remaining bucket, then decode speed:
the LLM alone and the SLM alone for 256 tokens (ms per token).

Writes ``engine_warmup_<gpu>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_TOKENS = 256


def child(variant: str, prompt: int, device: str = "cuda") -> dict:
    import torch

    import hf_rstitch  # noqa: F401  (patches generate)
    import lab
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import FastConfig, FastEngine

    t_start = time.perf_counter()
    llm, slm = lab.random_pair("qwen2" if device == "cuda" else "tiny", device)
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    t_models = time.perf_counter() - t_start
    config = FastConfig(compile=None if variant == "none" else variant, graphs=None if device == "cuda" else False)
    engine = FastEngine(config, capacity=prompt + CHILD_TOKENS + 16)
    ids = torch.randint(3, 200, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)

    def gen(route, n):
        return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_engine=engine,
                            stitch_policy=ReplayPolicy(route), max_new_tokens=n, do_sample=False)

    first, _ = lab.timed(lambda: gen(["slm", "slm", "llm", "llm", "slm"], 5), device)
    warm = sum(lane.warm_up() for lane in engine._lanes.values())
    speed = {}
    for role in ("llm", "slm"):
        gen([role] * 8, 8)
        sec, _ = lab.timed(lambda: gen([role] * CHILD_TOKENS, CHILD_TOKENS), device)
        speed[f"{role}_ms_per_token"] = 1e3 * sec / CHILD_TOKENS
    return {"variant": variant, "models_s": t_models, "first_generate_s": first, "warm_up_rest_s": warm,
            "ready_s": first + warm, "gemv_tune_s": sum(lane.gemv_tune_seconds for lane in engine._lanes.values()),
            **speed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--variants", nargs="+", default=["parts", "decode"])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dry-cpu", action="store_true", help="tiny models on CPU, no graphs: checks the script")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.prompt, "cpu" if args.dry_cpu else "cuda")), flush=True)
        return
    import lab

    res = {"environment": lab.environment(["cpu" if args.dry_cpu else "cuda"]), "rows": [], "command": lab.command()}
    gpu = re.sub(r"[^a-z0-9]+", "_", res["environment"]["devices"][0].lower()).strip("_")
    stem = Path(args.out_dir) / f"engine_warmup_{gpu}"
    for variant in args.variants:
        caches = tempfile.mkdtemp(prefix=f"rstitch_warm_{variant}_")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor", "TRITON_CACHE_DIR": f"{caches}/triton"}
        for run in ("cold", "warm"):
            t0 = time.perf_counter()
            cmd = [sys.executable, __file__, "--child", variant, "--prompt", str(args.prompt)] + ["--dry-cpu"] * args.dry_cpu
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            row = json.loads(line[-1][7:]) if line else {"variant": variant, "error": done.stderr[-2000:]}
            row.update(caches=run, process_s=time.perf_counter() - t0)
            res["rows"].append(row)
            print(f"[{variant} {run}] {row}", flush=True)
            lab.write_result(stem, res, markdown(res))
    print(markdown(res))


def markdown(res: dict) -> str:
    env = res["environment"]
    lines = [f"# Fast engine warm-up in a fresh process: random Qwen2 7B / 1.5B bf16, B = 1, {env['devices'][0]}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}. Cold: empty compile caches; "
             "warm: a second process with the caches the first one wrote (torch's own on-disk caches).", "",
             "| compile | caches | ready (s) | first generate (s) | warm-up of the rest (s) | GEMV tuning (s) | "
             "LLM ms/token | SLM ms/token |", "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['caches']} | error | | | | | |")
            continue
        lines.append(f"| {r['variant']} | {r['caches']} | {r['ready_s']:.1f} | {r['first_generate_s']:.1f} | "
                     f"{r['warm_up_rest_s']:.1f} | {r['gemv_tune_s']:.1f} | {r['llm_ms_per_token']:.2f} | "
                     f"{r['slm_ms_per_token']:.2f} |")
    lines += ["", f"Regenerate: `{res['command']}`"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
