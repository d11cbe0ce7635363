"""Train the shipped router for the toy-world pair on one GPU and sweep the accuracy-latency plane.

    PYTHONPATH=. python benchmarks/router_train_pair.py --out OUT --minutes 5

1. profiles both models on this device (Eq. 4 fit, saved as latency.json);
2. sweeps R-Stitch thresholds with batched greedy stitched decoding on the test split
   (``hf_rstitch.eval.sweep``: accuracy, mean predicted latency L_hat in ms, LLM-token share);
3. picks lambda so that the mean L_hat of LLM-only decoding costs ``--lam-weight`` of the
   accuracy reward (lambda = weight / mean L_hat(LLM-only));
4. trains the router (hf_rstitch.training.router) for ``--minutes``;
5. sweeps the router the same way and measures its per-call overhead.
Writes router_config.json, router_model.safetensors, latency.json, metrics.jsonl, sweep.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch

import hf_rstitch  # noqa: F401
from hf_rstitch.eval import sweep
from hf_rstitch.eval.methods import GenSettings, LearnedRouter
from hf_rstitch.router import RouterPolicy
from hf_rstitch.router.config import RouterTrainConfig
from hf_rstitch.training.router import load_latency_model, train_router
from hf_rstitch.toyworld.pair import load_pair, load_test_split
from lab import timed

GREEDY_400 = GenSettings(max_new_tokens=400)


def plane_point(row: dict) -> dict:
    """One point of the accuracy-latency plane from a :func:`hf_rstitch.eval.sweep` row."""
    return {k: row[k] for k in ("accuracy", "latency_ms", "llm_token_share")} | {"new_tokens": row["new_tokens"]}


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--n-test", type=int, default=600)
    ap.add_argument("--lam-weight", type=float, default=0.5)
    ap.add_argument("--threshold", type=float, default=0.001)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--do-sample", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--llm-bias", type=float, default=2.0)
    ap.add_argument("--scale-advantages", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--latency", default="", help="reuse this latency.json instead of profiling")
    return ap.parse_args()


def train(args, llm, slm, tok, lm, lam: float, work: Path):
    cfg = RouterTrainConfig(out=str(work), threshold=args.threshold, lam=lam, steps=1000, max_minutes=args.minutes,
                            device="cuda", checkpoint_every=10, temperature=args.temperature, lr=args.lr,
                            do_sample=args.do_sample, llm_bias=args.llm_bias,
                            scale_advantages=args.scale_advantages,
                            latency_profile=str(work / "latency.json"))
    return train_router(cfg, llm=llm, slm=slm, tokenizer=tok, latency_model=lm, log=lambda s: print(s, flush=True))


def save(out: Path, work: Path, sweep_res: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep_res, indent=1) + "\n")
    for src, dst in (("router/config.json", "router_config.json"), ("router/model.safetensors",
                     "router_model.safetensors"), ("latency.json", "latency.json"), ("metrics.jsonl", "metrics.jsonl")):
        shutil.copy(work / src, out / dst)


def main() -> None:
    args = parse_args()
    work = Path("/tmp/router_run")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    llm, slm, tok = load_pair("cuda")
    if args.latency:
        shutil.copy(args.latency, work / "latency.json")
    t0 = time.perf_counter()
    lm = load_latency_model(RouterTrainConfig(out=str(work), threshold=args.threshold, device="cuda"), llm, slm, work)
    print(f"profiled in {time.perf_counter() - t0:.0f}s: {lm}", flush=True)

    rows = load_test_split()[: args.n_test]
    sweep_kw = dict(batch_size=len(rows), latency_model=lm)  # the whole split in one batch
    res = {"device": torch.cuda.get_device_name(), "n_test": len(rows), "rstitch": {}, "router": {}}
    taus = [0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 1.0]
    for tau, row in zip(taus, sweep(llm, slm, tok, rows, taus, **sweep_kw)):
        res["rstitch"][tau] = plane_point(row)
        print("rstitch", tau, res["rstitch"][tau], flush=True)
    res["lambda"] = lam = args.lam_weight / res["rstitch"][0.0]["latency_ms"]
    print(f"lambda = {args.lam_weight} / {res['rstitch'][0.0]['latency_ms']:.1f} ms = {lam:.3g}", flush=True)

    router = train(args, llm, slm, tok, lm, lam, work)
    for tau in sorted({args.threshold, 0.001, 0.005, 0.01, 0.02}):
        method = LearnedRouter(llm, slm, GREEDY_400, RouterPolicy(router, tau))
        (row,) = sweep(llm, slm, tok, rows, methods=[method], **sweep_kw)
        res["router"][tau] = plane_point(row)
        print("router", tau, res["router"][tau], flush=True)
    x = torch.randn(1, router.hidden_size, device="cuda")
    times = [timed(lambda: router.log_probs(x).argmax(-1), "cuda")[0] * 1e3 for _ in range(300)]
    res["router_overhead_ms_gpu_median"] = statistics.median(times[50:])
    print("router overhead ms (GPU, batch 1):", res["router_overhead_ms_gpu_median"], flush=True)
    save(Path(args.out), work, res)


if __name__ == "__main__":
    main()
