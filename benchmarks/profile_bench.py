"""Profile random-weight Qwen2 1.5B / 7B shapes (bf16) and check Eq. 4 on replayed call sequences.

    PYTHONPATH=. python benchmarks/profile_bench.py --out-dir benchmarks/results [--sizes 1.5b 7b]

1. For each size: ``profile_model`` over the grid, JSON written to
   ``<out-dir>/latency_qwen2_<size>.json`` as soon as that size is done.
2. ``--replay N`` (needs both sizes): N synthetic stitched call sequences, built from random
   routes the way a stitched decoder schedules its calls (both lanes keep their own cache; a
   lane that regains control first processes, in one call, every token the other model wrote
   since it last ran; an SLM->LLM hand-over costs one discarded SLM decode step). Each
   sequence is executed with real forward calls (random ids, device synchronised after each
   call, as a decoder that reads entropy on the host would) and its wall time is compared with
   ``LatencyModel.predict_trace``. This checks the estimator, not the stitched decoder: the
   real check is ``benchmarks/latency_validation.py``.

Prints a table and writes JSON; timings are medians over repeats (see hf_rstitch.latency.profiler).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_rstitch.latency import LatencyModel
from hf_rstitch.latency.profiler import device_name, fit_summary, profile_model, random_qwen2
from lab import switch_route, sync

PAPER = {  # R-Stitch appendix, A100, ms
    "1.5b": dict(a=0.000021, b=0.000231, c=-0.121046, d=27.090929),
    "7b": dict(a=0.000027, b=0.000031, c=-0.045256, d=27.040801),
}


def schedule(prompt_len: int, route: list[str]) -> list[tuple[str, int, int]]:
    """(role, n_inf, n_kv) of each forward call a stitched decode of ``route`` makes."""
    seen = {"slm": 0, "llm": 0}  # tokens each lane's cache holds
    calls, length = [], prompt_len  # length: tokens in the sequence so far
    for i, role in enumerate(route):
        if role == "llm" and (i == 0 or route[i - 1] == "slm"):
            calls.append(("slm", length - seen["slm"], seen["slm"]))  # SLM proposal, discarded (hand-over)
            seen["slm"] = length
        calls.append((role, length - seen[role], seen[role]))
        seen[role] = length
        length += 1
    return calls


@torch.inference_mode()
def replay(models: dict, calls: list[tuple[str, int, int]], device) -> float:
    """Execute ``calls`` with real forwards; returns wall seconds."""
    from transformers import DynamicCache

    caches = {r: DynamicCache(config=m.config) for r, m in models.items()}
    ids = {r: torch.randint(0, m.config.vocab_size, (1, 8192), device=device) for r, m in models.items()}
    sync(device)
    t0 = time.perf_counter()
    for role, n_inf, n_kv in calls:
        assert caches[role].get_seq_length() == n_kv
        models[role](input_ids=ids[role][:, :n_inf], past_key_values=caches[role], use_cache=True, logits_to_keep=1)
        sync(device)  # a stitched decoder reads the entropy on the host after every call
    return time.perf_counter() - t0


def replay_check(profiles: dict, models: dict, n: int, device, seed: int) -> dict:
    lm = LatencyModel.from_profiles(slm=profiles["1.5b"], llm=profiles["7b"])
    lm_dec = LatencyModel.from_profiles(slm=profiles["1.5b"], llm=profiles["7b"], decode_fit=True)
    rng, rows = random.Random(seed), []
    replay(models, schedule(64, switch_route(16, 4, seed=rng.randrange(1 << 30))), device)  # warm-up
    for i in range(n):
        prompt, n_new = rng.choice([128, 512, 1024, 2048]), rng.choice([64, 128, 192, 256])
        route = switch_route(n_new, rng.choice([0, 2, 8, 24, 64]), seed=rng.randrange(1 << 30))
        calls = schedule(prompt, route)
        measured = replay(models, calls, device) * 1e3
        pred, pred_dec = lm.predict_trace(calls), lm_dec.predict_trace(calls)
        rows.append(dict(prompt=prompt, new_tokens=n_new, switches=sum(a != b for a, b in zip(route, route[1:])),
                         llm_share=route.count("llm") / n_new, calls=len(calls), measured_ms=measured,
                         predicted_ms=pred, predicted_decode_fit_ms=pred_dec,
                         abs_pct_err=abs(pred - measured) / measured * 100,
                         abs_pct_err_decode_fit=abs(pred_dec - measured) / measured * 100))
        print(f"replay {i + 1}/{n}: prompt={prompt} new={n_new} switches={rows[-1]['switches']} "
              f"measured={measured:.1f} ms predicted={pred:.1f} ms ({rows[-1]['abs_pct_err']:.1f}%) "
              f"decode-fit={pred_dec:.1f} ms", file=sys.stderr, flush=True)
    return {"what": "synthetic stitched call sequences replayed with real forward calls (not the stitched decoder)",
            "n": n, "median_abs_pct_err": statistics.median(r["abs_pct_err"] for r in rows),
            "median_abs_pct_err_decode_fit": statistics.median(r["abs_pct_err_decode_fit"] for r in rows),
            "rows": rows}


def markdown(profiles: dict, replay_result: dict | None, device: str) -> str:
    lines = [f"# Latency coefficients: random-weight Qwen2 shapes (bf16) on {device} vs the paper (A100)", "",
             "T(N_inf, N_kv) = a*N_inf*N_kv + b*N_inf^2 + c*N_inf + d, milliseconds (paper Eq. 4).", "",
             "| model | source | a | b | c | d | R^2 | decode fit: slope, intercept (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for size, prof in profiles.items():
        f, dfit = prof.fit, prof.decode_fit
        p = PAPER[size]
        lines.append(f"| {size.upper()} | paper, A100 | {p['a']:.6f} | {p['b']:.6f} | {p['c']:.6f} | {p['d']:.3f} | - | - |")
        dec = f"{dfit.a:.6f}, {dfit.d:.3f} (R^2 {dfit.r2:.3f})" if dfit else "-"
        lines.append(f"| {size.upper()} | measured, {prof.meta['device']} | {f.a:.6f} | {f.b:.6f} | {f.c:.6f} | "
                     f"{f.d:.3f} | {f.r2:.4f} | {dec} |")
    if replay_result:
        lines += ["", f"Replay check ({replay_result['what']}): {replay_result['n']} sequences, median absolute "
                  f"error {replay_result['median_abs_pct_err']:.1f} % (Eq. 4 fit), "
                  f"{replay_result['median_abs_pct_err_decode_fit']:.1f} % (decode fit for N_inf = 1 calls)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--sizes", nargs="+", default=["1.5b", "7b"], choices=["1.5b", "7b"])
    ap.add_argument("--n-inf", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64, 256, 1024, 2048, 4096])
    ap.add_argument("--n-kv", nargs="+", type=int, default=[0, 512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--replay", type=int, default=20, help="synthetic stitched sequences to check (0: skip)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    profiles, models = {}, {}
    for size in args.sizes:
        t0 = time.perf_counter()
        models[size] = random_qwen2(size, torch.bfloat16, device, seed=args.seed)
        print(f"built random qwen2-{size} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        prof = profile_model(models[size], n_inf=args.n_inf, n_kv=args.n_kv, repeats=args.repeats,
                             warmup=args.warmup, name=f"random-qwen2-{size}", seed=args.seed)
        profiles[size] = prof
        (out / f"latency_qwen2_{size}.json").write_text(json.dumps(prof.to_dict(), indent=1) + "\n")
        print(f"qwen2-{size}\n{fit_summary(prof)}", flush=True)
    replay_result = None
    if args.replay and {"1.5b", "7b"} <= set(profiles):
        replay_result = replay_check(profiles, {"slm": models["1.5b"], "llm": models["7b"]}, args.replay,
                                     device, args.seed)
        (out / "latency_replay_check.json").write_text(json.dumps(replay_result, indent=1) + "\n")
    md = markdown(profiles, replay_result, device_name(device))
    (out / "latency_coefficients.md").write_text(md)
    print(md)
    print(json.dumps({"device": device_name(device), **{s: p.fit.to_dict() for s, p in profiles.items()},
                      "replay_median_abs_pct_err": replay_result and replay_result["median_abs_pct_err"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
