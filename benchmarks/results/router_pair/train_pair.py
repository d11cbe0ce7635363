"""Train the shipped router for the toy-world pair on one GPU and sweep the accuracy-latency plane.

    python benchmarks/results/router_pair/train_pair.py --out OUT --minutes 5

1. profiles both models on this device (Eq. 4 fit, saved as latency.json);
2. sweeps R-Stitch thresholds with batched greedy stitched decoding on the test split
   (accuracy, mean predicted latency L_hat in ms, LLM-token share);
3. picks lambda so that the mean L_hat of LLM-only decoding costs ``--lam-weight`` of the
   accuracy reward (lambda = weight / mean L_hat(LLM-only));
4. trains the router (hf_rstitch.router.train) for ``--minutes``;
5. sweeps the router the same way and measures its per-call overhead.
Writes router_config.json, router_model.safetensors, latency.json, metrics.jsonl, sweep.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

import hf_rstitch  # noqa: E402,F401
from hf_rstitch.router import RouterPolicy  # noqa: E402
from hf_rstitch.router.config import RouterTrainConfig  # noqa: E402
from hf_rstitch.router.rollout import encode_prompts, left_pad  # noqa: E402
from hf_rstitch.router.train import load_latency_model, train_router  # noqa: E402
from hf_rstitch.toyworld.pair import grade, load_pair, load_test_split  # noqa: E402


@torch.no_grad()
def sweep_point(llm, slm, tok, ids, mask, answers, lm, **stitch) -> dict:
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, max_new_tokens=400, do_sample=False,
                       temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id,
                       return_dict_in_generate=True, **stitch)
    new = out.sequences[:, ids.shape[1]:].cpu()
    traces = out.stitch
    correct = [grade(tok.decode(new[i, :t.n_tokens], skip_special_tokens=True), a)
               for i, (t, a) in enumerate(zip(traces, answers))]
    lat = [lm.predict_trace(t) for t in traces]
    return {"accuracy": sum(correct) / len(correct), "latency_ms": statistics.fmean(lat),
            "llm_token_share": sum(t.llm_tokens for t in traces) / sum(t.n_tokens for t in traces),
            "new_tokens": statistics.fmean(t.n_tokens for t in traces)}


def main() -> None:
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
    args = ap.parse_args()
    out, work = Path(args.out), Path("/tmp/router_run")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    llm, slm, tok = load_pair("cuda")
    if args.latency:
        shutil.copy(args.latency, work / "latency.json")
    base = RouterTrainConfig(out=str(work), threshold=args.threshold, device="cuda")
    t0 = time.perf_counter()
    lm = load_latency_model(base, llm, slm, work)
    print(f"profiled in {time.perf_counter() - t0:.0f}s: {lm}", flush=True)

    rows = load_test_split()[: args.n_test]
    ids, mask = left_pad(encode_prompts(tok, [r["problem"] for r in rows]), tok.pad_token_id)
    ids, mask = ids.cuda(), mask.cuda()
    answers = [r["answer"] for r in rows]
    sweep = {"device": torch.cuda.get_device_name(), "n_test": len(rows), "rstitch": {}, "router": {}}
    for tau in [0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 1.0]:
        sweep["rstitch"][tau] = sweep_point(llm, slm, tok, ids, mask, answers, lm, stitch_threshold=tau)
        print("rstitch", tau, sweep["rstitch"][tau], flush=True)
    lam = args.lam_weight / sweep["rstitch"][0.0]["latency_ms"]
    sweep["lambda"] = lam
    print(f"lambda = {args.lam_weight} / {sweep['rstitch'][0.0]['latency_ms']:.1f} ms = {lam:.3g}", flush=True)

    cfg = RouterTrainConfig(out=str(work), threshold=args.threshold, lam=lam, steps=1000, max_minutes=args.minutes,
                            device="cuda", checkpoint_every=10, temperature=args.temperature, lr=args.lr,
                            do_sample=args.do_sample, llm_bias=args.llm_bias,
                            scale_advantages=args.scale_advantages,
                            latency_profile=str(work / "latency.json"))
    router = train_router(cfg, llm=llm, slm=slm, tokenizer=tok, latency_model=lm,
                          log=lambda s: print(s, flush=True))
    for tau in sorted({args.threshold, 0.001, 0.005, 0.01, 0.02}):
        sweep["router"][tau] = sweep_point(llm, slm, tok, ids, mask, answers, lm,
                                           stitch_policy=RouterPolicy(router, tau))
        print("router", tau, sweep["router"][tau], flush=True)
    x = torch.randn(1, router.hidden_size, device="cuda")
    times = []
    for _ in range(300):
        torch.cuda.synchronize()
        t = time.perf_counter()
        router.log_probs(x).argmax(-1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    sweep["router_overhead_ms_gpu_median"] = statistics.median(times[50:])
    print("router overhead ms (GPU, batch 1):", sweep["router_overhead_ms_gpu_median"], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep, indent=1) + "\n")
    shutil.copy(work / "router" / "config.json", out / "router_config.json")
    shutil.copy(work / "router" / "model.safetensors", out / "router_model.safetensors")
    shutil.copy(work / "latency.json", out / "latency.json")
    shutil.copy(work / "metrics.jsonl", out / "metrics.jsonl")


if __name__ == "__main__":
    main()
