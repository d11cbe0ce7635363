"""Fast engine vs the bandwidth floor and transformers' decoders (random-weight Qwen2 1.5B / 7B, bf16, B=1).

    PYTHONPATH=. python benchmarks/engine_bench.py --out-dir benchmarks/results [--quick] [--budget-s 330]

One process, one GPU, in this order (each section is skipped, with the reason recorded, once
the time budget would run out):

1. copy bandwidth (device-to-device, bytes read + written) and the floor of each model
   (weight bytes / bandwidth);
2. fast engine: warm-up (graph capture, compilation), then LLM-only and SLM-only decoding
   through ``generate(..., stitch_engine=engine)`` with a constant route, and through a bare
   lane loop (no policy, no per-token sync) -- for each variant (graphs of eager kernels;
   graphs of compiled steps);
3. transformers: plain ``generate`` (DynamicCache), ``generate`` with a static compiled cache,
   assisted generation with the same pair;
4. stitched decoding of replayed routes (10/30/50 % LLM tokens, mean LLM run 1/4/16 tokens)
   against the sum of per-model token costs;
5. a route shaped like the paper's MATH row (7B, 8k budget: LLM-only 2753 tokens vs R-Stitch
   tau=0.02 with 344 LLM + 771 SLM tokens) and its end-to-end speedup.

Times are wall seconds of whole calls with the device synchronised before and after; ms/token
divides by the new tokens (the prompt's prefill is included once). Writes
``engine_<gpu>.json`` (device, versions, date, every number) and ``engine_<gpu>.md``; prints
one compact JSON document as its last line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import hf_rstitch  # noqa: F401  (patches generate; plain calls pass through untouched)
from hf_rstitch import ReplayPolicy
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.routes import route, switches
from hf_rstitch.latency.profiler import random_qwen2
import lab

MATH = {"llm_only_tokens": 2753, "llm_tokens": 344, "slm_tokens": 771}  # paper, MATH, 7B pair, 8k budget
VARIANTS = {"graphs": FastConfig(), "graphs-sdpa": FastConfig(attention="sdpa"),
            "compiled-decode": FastConfig(compile="decode"), "compiled": FastConfig(compile="all"),
            # compile="all" for the catch-up sizes a short hand-over meets (buckets 1, 2, 4) only: most of
            # its per-switch saving at a fraction of its warm-up
            "compiled-4": FastConfig(compile="all", compile_max_bucket=4),
            # the same without the tuned Triton GEMV (cuBLAS for every linear layer), as measured before it existed
            "graphs-cublas": FastConfig(gemv=False), "compiled-decode-cublas": FastConfig(compile="decode", gemv=False)}


class Budget:
    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def allows(self, need: float) -> bool:
        return self.left() >= need


DEVICE = "cuda"
SAVE = lambda: None  # noqa: E731  (set by main: write the JSON and table so far)


def sync() -> None:
    lab.sync(DEVICE)


def timed(fn):
    return lab.timed(fn, DEVICE)


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written (median of repeats)."""
    if DEVICE != "cuda":  # dry run
        src = torch.randn(nbytes // 2, dtype=torch.bfloat16)
        return 2 * nbytes / timed(lambda: src.clone())[0] / 1e9
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times) / 1e9


def weight_bytes(model) -> dict:
    """All parameter bytes (tied tensors once), and the bytes a decode step must read."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    emb = model.get_input_embeddings().weight
    tied = emb.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    read = total - (0 if tied else emb.numel() * emb.element_size())  # one embedding row per token
    return {"weight_bytes": total, "decode_read_bytes": read, "tied_embeddings": tied}


def tiny_pair() -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def make(hidden, layers):
        cfg = Qwen2Config(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2)
        return Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()

    torch.manual_seed(0)
    return {"slm": make(32, 2), "llm": make(64, 3)}


def prompt_ids(vocab: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (1, length), generator=g).to(DEVICE)


def stitched(llm, slm, ids, roles, engine, **kw):
    """Timed ``generate`` replaying ``roles``; returns (seconds, output)."""
    return timed(lambda: llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy(roles),
                                      stitch_engine=engine, max_new_tokens=len(roles), do_sample=False,
                                      return_dict_in_generate=True, **kw))


def warm_route(max_bucket: int) -> list[str]:
    """Runs of 1, 2, 3, 5, ... up to max_bucket tokens for each model: every bucket gets captured."""
    lengths, n = [], 1
    while n < max_bucket:
        lengths.append(n)
        n = max(n + 1, int(n * 1.6))
    roles = []
    for n in lengths:
        roles += ["slm"] * n + ["llm"] * n
    return roles


def bare_lane_decode(lane, ids: torch.Tensor, n: int) -> float:
    """Seconds per token of a bare greedy loop over one lane (no policy, no per-token sync)."""
    rows, resumed = torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)
    t = ids.shape[1]
    buf = torch.cat([ids, ids.new_zeros(1, n)], dim=1)  # [1, T + n]
    mask = torch.ones_like(buf)
    logits, _, _ = lane.advance(buf[:, :t], mask[:, :t], rows, resumed)  # prefill
    buf[:, t] = logits.argmax(-1)
    sync()
    t0 = time.perf_counter()
    for i in range(1, n):
        logits, _, _ = lane.advance(buf[:, : t + i], mask[:, : t + i], rows, resumed)
        buf[:, t + i] = logits.argmax(-1)
    sync()
    return (time.perf_counter() - t0) / (n - 1)


def fast_section(llm, slm, ids, args, budget, res):
    out = res["fast"] = {}
    new = args.new
    for name in args.variants:
        if not budget.allows(60 if name.startswith("graphs") else 150):
            out[name] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
            continue
        cfg = VARIANTS[name]
        engine = FastEngine(cfg, capacity=args.capacity)
        row = out[name] = {"config": repr(cfg)}
        try:
            warm = warm_route(cfg.max_bucket)
            sec, _ = stitched(llm, slm, ids, warm, engine)
            row["warmup_s"] = sec
            row["capture_s"] = engine.capture_seconds()
            row["gemv_tune_s"] = sum(lane.gemv_tune_seconds for lane in engine._lanes.values())
            row["gemv_layers"] = {str(r): len(lane.gemv_layers) for r, lane in engine._lanes.items()}
            row["graphs"] = engine.graph_count()
            sec2, _ = stitched(llm, slm, ids, warm, engine)
            row["warm_route_tokens"] = len(warm)
            row["warm_route_second_run_s"] = sec2
            # every bucket captured (and compiled) before any timed run: lazily compiled sizes would land in one
            row["warm_up_every_bucket_s"] = sum(lane.warm_up() for lane in engine._lanes.values())
            for role in ("llm", "slm"):
                secs = [stitched(llm, slm, ids, [role] * new, engine)[0] for _ in range(args.repeats)]
                row[f"{role}_only_ms_per_token"] = 1e3 * statistics.median(secs) / new
                row[f"{role}_only_runs_s"] = secs
            for role, model in ((Role.LLM, llm), (Role.SLM, slm)):
                lane = engine._lanes[role]
                lane.reset()
                row[f"{role}_bare_lane_ms_per_token"] = 1e3 * bare_lane_decode(lane, ids, min(new, 512))
            row["builds"] = engine.builds
            row["engine"] = engine
        except Exception as err:  # keep the run going; record what broke
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
            print(f"[fast:{name}] {row['error']}", file=sys.stderr)
        print(f"[fast:{name}] { {k: v for k, v in row.items() if k != 'engine'} }", flush=True)
        SAVE()


def pad_vocab_for_assisted(llm, slm) -> str:
    """transformers' assisted generation refuses a pair whose vocabulary sizes differ (it then asks
    for two tokenizers and switches to universal assisted decoding). The random Qwen2 shapes differ
    the way the real checkpoints do (7B: 152064 embedding rows, 1.5B: 151936; they share one
    tokenizer, the extra rows are padding), so the SLM's embedding is padded to the LLM's size with
    ``resize_token_embeddings`` -- 128 rows, ~0.01 % of its weights. Runs after every fast-engine
    section; returns what it did ("" when nothing was needed)."""
    want, have = llm.config.vocab_size, slm.config.vocab_size
    if want == have:
        return ""
    slm.resize_token_embeddings(want, mean_resizing=False)
    slm.generation_config.pad_token_id = 0
    return (f"SLM embedding padded from {have} to {want} rows (resize_token_embeddings) so that "
            "assisted generation accepts the pair; ~0.01 % more SLM weights")


def hf_plain_section(llm, slm, ids, args, budget, res):
    out = res.setdefault("transformers", {})
    n = args.baseline_new
    for tag, model in (("llm", llm), ("slm", slm)):
        if not budget.allows(20):
            out[f"{tag}_plain"] = {"skipped": "time budget"}
            continue
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
        sec, o = timed(lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False))
        out[f"{tag}_plain"] = {"ms_per_token": 1e3 * sec / n, "new_tokens": o.shape[1] - ids.shape[1]}
        print(f"[hf plain {tag}] {out[f'{tag}_plain']}", flush=True)
        SAVE()
    if not budget.allows(30):
        out["assisted"] = {"skipped": "time budget"}
        return
    note = pad_vocab_for_assisted(llm, slm)
    if note:
        out["assisted_note"] = note
        print(f"[hf assisted] {note}", flush=True)
    calls = {"llm": 0, "slm": 0}
    hooks = [m.register_forward_pre_hook(lambda *_, t=t: calls.__setitem__(t, calls[t] + 1))
             for t, m in (("llm", llm), ("slm", slm))]
    try:
        llm.generate(ids, assistant_model=slm, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        calls.update(llm=0, slm=0)
        sec, o = timed(lambda: llm.generate(ids, assistant_model=slm, max_new_tokens=n, min_new_tokens=n,
                                            do_sample=False))
        got = o.shape[1] - ids.shape[1]
        out["assisted"] = {"ms_per_token": 1e3 * sec / got, "new_tokens": got, "llm_forwards": calls["llm"],
                           "slm_forwards": calls["slm"], "tokens_per_llm_forward": got / max(calls["llm"], 1)}
    finally:
        for h in hooks:
            h.remove()
    print(f"[hf assisted] {out['assisted']}", flush=True)
    mr = res.get("math_route", {})
    plain = out.get("llm_plain", {}).get("ms_per_token")
    if plain and "stitched" in mr:
        mr["llm_only_plain_generate_s_estimate"] = plain * MATH["llm_only_tokens"] / 1e3
        mr["speedup_vs_plain_generate_estimate"] = mr["llm_only_plain_generate_s_estimate"] / mr["stitched"]["seconds"]


def hf_static_section(llm, slm, ids, args, budget, res):
    out = res.setdefault("transformers", {})
    for tag, model in (("llm", llm), ("slm", slm)):
        if args.skip_static or not budget.allows(100):
            out[f"{tag}_static_compiled"] = {"skipped": "--skip-static" if args.skip_static else
                                             f"time budget ({budget.left():.0f} s left)"}
            continue
        row = out[f"{tag}_static_compiled"] = {}
        try:
            kw = dict(do_sample=False, cache_implementation="static")
            sec, _ = timed(lambda: model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw))
            row["first_call_s"] = sec  # compilation
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
            m = args.static_new
            sec, o = timed(lambda: model.generate(ids, max_new_tokens=m, min_new_tokens=m, **kw))
            row.update(ms_per_token=1e3 * sec / m, new_tokens=o.shape[1] - ids.shape[1])
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
        print(f"[hf static {tag}] {row}", flush=True)
        SAVE()


def best_engine(res):
    best = None
    for name, row in res["fast"].items():
        if "llm_only_ms_per_token" in row and (best is None or row["llm_only_ms_per_token"] <
                                               res["fast"][best]["llm_only_ms_per_token"]):
            best = name
    return best


def stitch_section(llm, slm, ids, args, budget, res):
    name = best_engine(res)
    out = res["stitched"] = {"variant": name, "runs": []}
    if name is None:
        out["skipped"] = "no working fast variant"
        return
    row = res["fast"][name]
    engine, c_llm, c_slm = row["engine"], row["llm_only_ms_per_token"], row["slm_only_ms_per_token"]
    for share in args.shares:
        for run in args.llm_runs:
            if not budget.allows(15):
                out["runs"].append({"llm_share": share, "llm_run": run, "skipped": "time budget"})
                continue
            roles = route(args.new, round(share * args.new), run, seed=1)
            sec, o = stitched(llm, slm, ids, roles, engine)
            out["runs"].append(_stitch_row(roles, sec, o, c_llm, c_slm, share, run))
            print(f"[stitched] {out['runs'][-1]}", flush=True)
            SAVE()


def _stitch_row(roles, sec, o, c_llm, c_slm, share, run):
    n_llm, n_slm = roles.count("llm"), roles.count("slm")
    predicted = (n_llm * c_llm + n_slm * c_slm) / 1e3
    s = o.stitch.summary()
    forwards = forward_costs_s(s["llm_forward_calls"], s["slm_forward_calls"], c_llm, c_slm)
    return {"llm_share": share, "llm_run": run, "new_tokens": len(roles), "llm_tokens": n_llm, "slm_tokens": n_slm,
            "switches": switches(roles), "seconds": sec, "ms_per_token": 1e3 * sec / len(roles),
            "sum_of_token_costs_s": predicted, "ratio_to_sum": sec / predicted,
            "llm_forward_calls": s["llm_forward_calls"], "slm_forward_calls": s["slm_forward_calls"],
            "discarded_slm_tokens": s["discarded_slm_tokens"],
            "sum_of_forward_costs_s": forwards, "ratio_to_forwards": sec / forwards,
            "roles_match": [str(r) for r in o.stitch.roles] == roles}


def forward_costs_s(llm_calls: int, slm_calls: int, c_llm: float, c_slm: float) -> float:
    """Seconds the route's forwards cost at each model's one-token price (``c_*`` in ms): the kept
    tokens plus the SLM proposals a hand-over discards, which R-Stitch must compute to read their
    entropy. Against this the measured time shows what the engine adds per switch."""
    return (llm_calls * c_llm + slm_calls * c_slm) / 1e3


def math_section(llm, slm, ids, args, budget, res):
    name = best_engine(res)
    out = res["math_route"] = {"paper": MATH, "variant": name, "llm_run": args.math_llm_run}
    if name is None or not budget.allows(40):
        out["skipped"] = "no working fast variant" if name is None else "time budget"
        return
    row = res["fast"][name]
    engine = row["engine"]
    n = MATH["llm_tokens"] + MATH["slm_tokens"]
    roles = route(n, MATH["llm_tokens"], args.math_llm_run, seed=2)
    sec_s, o = stitched(llm, slm, ids, roles, engine)
    out["stitched"] = _stitch_row(roles, sec_s, o, row["llm_only_ms_per_token"], row["slm_only_ms_per_token"],
                                  MATH["llm_tokens"] / n, args.math_llm_run)
    sec_l, o = stitched(llm, slm, ids, ["llm"] * MATH["llm_only_tokens"], engine)
    out["llm_only_fast_s"] = sec_l
    out["speedup_fast"] = sec_l / sec_s
    print(f"[math] {out}", flush=True)


def _ratio_counting_discards(row: dict, res: dict, variant: str) -> float:
    """A stitched row's time over :func:`forward_costs_s` at ``variant``'s token prices (also for
    result files written before rows stored it)."""
    c_llm, c_slm = (res["fast"][variant][f"{m}_only_ms_per_token"] for m in ("llm", "slm"))
    return row["seconds"] / forward_costs_s(row["llm_forward_calls"], row["slm_forward_calls"], c_llm, c_slm)


def markdown(res) -> str:
    d, f = res["device"], res.get("fast", {})
    lines = [f"# Fast engine benchmark: random-weight Qwen2 1.5B (SLM) / 7B (LLM), bf16, B=1, {d['name']}", "",
             f"torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, {res['date']}; "
             f"prompt {res['args']['prompt']} tokens, {res['args']['new']} new tokens (baselines without the fast "
             f"engine: {res['args']['baseline_new']} new tokens). Copy bandwidth "
             f"{res['bandwidth_gbps']:.0f} GB/s (read + write).", "",
             "| model | floor (ms/token) | fast: generate (ms/token, x floor) | fast: bare lane | plain generate | "
             "static compiled generate |", "|---|---|---|---|---|---|"]
    t = res.get("transformers", {})
    for tag in ("llm", "slm"):
        m = res["models"][tag]
        cells = []
        for name in f:
            r = f[name]
            if f"{tag}_only_ms_per_token" in r:
                v = r[f"{tag}_only_ms_per_token"]
                cells.append(f"{name}: {v:.2f} ({v / m['floor_ms']:.2f}x)")
        bare = [f"{n}: {f[n][f'{tag}_bare_lane_ms_per_token']:.2f}" for n in f if f"{tag}_bare_lane_ms_per_token" in f[n]]
        plain = t.get(f"{tag}_plain", {}).get("ms_per_token")
        static = t.get(f"{tag}_static_compiled", {}).get("ms_per_token")
        lines.append(f"| {m['size']} | {m['floor_ms']:.2f} (read bytes: {m['floor_read_ms']:.2f}) | "
                     f"{'; '.join(cells) or '-'} | {'; '.join(bare) or '-'} | "
                     f"{plain and f'{plain:.1f}' or '-'} | {static and f'{static:.2f}' or '-'} |")
    a = t.get("assisted", {})
    if "ms_per_token" in a:
        lines += ["", f"Assisted generation (7B + 1.5B, DynamicCache): {a['ms_per_token']:.1f} ms/token, "
                  f"{a['tokens_per_llm_forward']:.2f} tokens per LLM forward (random weights: drafts are rejected)."]
    for name in f:
        r = f[name]
        if "warmup_s" in r:
            lines.append(f"Warm-up `{name}`: {r['warmup_s']:.1f} s for the first generation "
                         f"({r['graphs']} graphs, {r['capture_s']:.1f} s capturing/compiling).")
    s = res.get("stitched", {})
    if s.get("runs"):
        lines += ["", f"Stitched, replayed routes ({s['variant']} variant):", "",
                  "| LLM share | mean LLM run | switches | ms/token | sum of token costs (s) | measured (s) | ratio "
                  "| discarded SLM proposals | ratio, counting them |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in s["runs"]:
            if "seconds" in r:
                lines.append(f"| {r['llm_share']:.0%} | {r['llm_run']} | {r['switches']} | {r['ms_per_token']:.2f} | "
                             f"{r['sum_of_token_costs_s']:.2f} | {r['seconds']:.2f} | {r['ratio_to_sum']:.3f} | "
                             f"{r['discarded_slm_tokens']} | {_ratio_counting_discards(r, res, s['variant']):.3f} |")
    mr = res.get("math_route", {})
    if "speedup_fast" in mr:
        st = mr["stitched"]
        lines += ["", f"MATH-shaped route (344 LLM + 771 SLM tokens, mean LLM run {mr['llm_run']}, "
                  f"{st['switches']} switches): stitched {st['seconds']:.2f} s vs LLM-only 2753 tokens "
                  f"{mr['llm_only_fast_s']:.2f} s in the fast engine: speedup {mr['speedup_fast']:.2f}x. "
                  f"Against the sum of token costs: {st['ratio_to_sum']:.3f}; counting the "
                  f"{st['discarded_slm_tokens']} discarded SLM proposals: "
                  f"{_ratio_counting_discards(st, res, mr['variant']):.3f}."]
        if "speedup_vs_plain_generate_estimate" in mr:
            lines.append(f"Against plain generate LLM-only (estimated from its ms/token): "
                         f"{mr['speedup_vs_plain_generate_estimate']:.1f}x.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--baseline-new", type=int, default=128, help="new tokens for plain / assisted generate")
    ap.add_argument("--static-new", type=int, default=512, help="new tokens for static compiled generate")
    ap.add_argument("--capacity", type=int, default=3072, help="fast-engine cache capacity (MATH route needs 2881)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["graphs"], choices=list(VARIANTS),
                    help="fast-engine variants (default: graphs). 'graphs-sdpa': the same with the fused SDPA "
                         "attention of the first H200 run (FastConfig(attention='sdpa')). 'compiled-decode' compiles the one-token step "
                         "only (catch-up buckets run as graphs of eager kernels); 'compiled' compiles every step "
                         "before capture and compiled for over 4 minutes for the 7B + 1.5B pair on an H200 "
                         "(2026-11-26), starving the later sections: run the compiled variants in a call of their "
                         "own")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    ap.add_argument("--llm-runs", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--math-llm-run", type=float, default=4.0)
    ap.add_argument("--skip-static", action="store_true")
    ap.add_argument("--skip-math", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330)
    ap.add_argument("--tag", default="")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script, times nothing")
    args = ap.parse_args()
    global DEVICE, SAVE
    if args.dry_run_cpu:
        DEVICE = "cpu"
        for cfg in VARIANTS.values():
            object.__setattr__(cfg, "graphs", False)
    budget = Budget(args.budget_s)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu dry run"
    res = {"device": {"name": name, "capability": torch.cuda.get_device_capability() if DEVICE == "cuda" else None},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version()},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "args": vars(args)}
    res["bandwidth_gbps"] = bw = copy_bandwidth(2 << 30 if DEVICE == "cuda" else 1 << 24)
    models = {"slm": random_qwen2("1.5b"), "llm": random_qwen2("7b")} if DEVICE == "cuda" else tiny_pair()
    res["models"] = {}
    for tag, m in models.items():
        m.generation_config.eos_token_id = None  # random weights: never stop early
        m.generation_config.pad_token_id = 0
        wb = weight_bytes(m)
        res["models"][tag] = {"size": "1.5b" if tag == "slm" else "7b", **wb,
                              "floor_ms": 1e3 * wb["weight_bytes"] / (bw * 1e9),
                              "floor_read_ms": 1e3 * wb["decode_read_bytes"] / (bw * 1e9)}
    print(f"[setup] {res['device']} bw={bw:.0f} GB/s models={res['models']} ({budget.left():.0f} s left)", flush=True)
    llm, slm = models["llm"], models["slm"]
    ids = prompt_ids(slm.config.vocab_size, args.prompt)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = re.sub(r"[^a-z0-9]+", "_", res["device"]["name"].lower()).strip("_")
    stem = out_dir / f"engine_{gpu}{args.tag}"

    def save():
        clean = json.loads(json.dumps(res, default=lambda o: None))
        stem.with_suffix(".json").write_text(json.dumps(clean, indent=1))
        try:
            stem.with_suffix(".md").write_text(markdown(res))
        except Exception as err:  # a table glitch must not lose the numbers
            print(f"[markdown] {type(err).__name__}: {err}", file=sys.stderr)

    SAVE = save
    with torch.no_grad():
        for section in (fast_section, stitch_section, math_section, hf_plain_section, hf_static_section):
            if section is math_section and args.skip_math:
                continue
            t0 = time.perf_counter()
            try:
                section(llm, slm, ids, args, budget, res)
            except Exception as err:
                res.setdefault("errors", {})[section.__name__] = f"{type(err).__name__}: {err}"[:2000]
                print(f"[{section.__name__}] {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            res.setdefault("section_seconds", {})[section.__name__] = time.perf_counter() - t0
            save()
    print(markdown(res))
    summary = {k: res[k] for k in ("device", "bandwidth_gbps")}
    summary["fast"] = {n: {k: v for k, v in r.items() if k.endswith("ms_per_token") or k in ("warmup_s", "error")}
                       for n, r in res.get("fast", {}).items()}
    print(json.dumps(json.loads(json.dumps(summary, default=lambda o: None))))


if __name__ == "__main__":
    main()
