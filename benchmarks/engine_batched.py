"""Batched fast engine on the MATH-shaped workload (random-weight pairs, bf16), one GPU.

    PYTHONPATH=. python benchmarks/engine_batched.py --out-dir $OUT [--batches 1 8 32 64 128 256] [--budget-s 540]
        [--pair qwen2 | qwen3 | qwen3-moe | gemma3] [--policies entropy router replay]

Pairs (``--pair``, :data:`PAIRS`): Qwen2 7B / 1.5B (dense, the default); Qwen3-8B / Qwen3-0.6B (dense);
Qwen3-30B-A3B / Qwen3-0.6B (the LLM's feed-forwards are 128 experts, 8 a token: the experts a step reads depend
on the rows, see below); Gemma 3 12B / 1B (hybrid attention: five sliding-window layers to one full, windows of
1024 / 512). Weights are random and made directly on the GPU.

Per row, the paper's MATH row (7B pair, 8k budget): the LLM alone writes 2753 tokens; stitched,
344 LLM + 771 SLM tokens in LLM runs of ~4 (``hf_rstitch.fast.routes.route``, a different seed
per row, so rows route independently). At each batch size both methods run in one
:class:`~hf_rstitch.fast.FastEngine` (every batch bucket captured before its timed runs), then
transformers' plain and static-cache ``generate`` run the LLM alone for ``--baseline-new``
tokens (their seconds for 2753 tokens are extrapolated per step and marked so).

Floor: bytes a method must read (weights once per forward call it needs, plus the KV cache of the
rows that need it, per step), over the measured device-to-device copy bandwidth. An MoE model reads its
dense weights and, per layer, the experts its rows select: the expected number of distinct experts for
``n`` rows, ``sum_e 1 - (1 - q_e)^n``, with ``q_e`` each expert's share of tokens measured on the model's own
router over 512 random tokens (:func:`expert_shares`). A sliding-window layer reads at most its window of
KV slots a row. For stitched
decoding a step needs the SLM if any row consults it (its token, or a proposal it hands over) and
the LLM if any row's token is the LLM's.

Who decides the stitched routes (``--policies``, a row's ``policy`` field): ``entropy``, the R-Stitch rule
(``EntropyPolicy``, threshold ``lab.TAU``), and ``router``, R-Stitch+ (a random router that votes for the LLM
wherever it is asked), decide them from the models' entropies, forced to follow the routes (``lab.RoutedPair``):
the path a user's call runs: its decisions read from the device a step late, the next step guessed and rolled back
at a hand-over where that pays (``hf_rstitch.decode.loop``, ``hf_rstitch.core.guessing``). ``replay`` replays them
(``ReplayPolicy``): the decisions are on the host and the loop never reads them from the device (the bound);
``--decisions device`` returns the same decisions on the GPU instead, as an entropy policy's are (the loop then
reads them as it reads the policies'). Every policy runs on the same forced models; the LLM and the SLM alone are replayed.

Writes ``engine_batched_<gpu>.json`` (``rows``: ``{"batch", "method", "seconds", "floor_seconds"}``
plus details, device, versions, date), ``.md`` and ``.png``; prints one compact JSON document last.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch
import transformers

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import AUTO, FastConfig, FastEngine
from hf_rstitch.fast.kernels import triton_support
from hf_rstitch.fast.buckets import bucket_for
from hf_rstitch.fast.kv_memory import kv_bytes_per_token
from hf_rstitch.fast.routes import route, switches

sys.path.insert(0, str(Path(__file__).parent))
import engine_shapes  # noqa: E402
import lab  # noqa: E402  (the lab's shared helpers: bandwidth, weight bytes, timing)

MATH = lab.MATH
DEVICE = "cuda"  # "cpu" for --dry-run-cpu


def timed(fn):
    return lab.timed(fn, DEVICE)


PAIRS = {"qwen3": ("qwen3-8b", "qwen3-0.6b"), "qwen3-moe": ("qwen3-30b-a3b", "qwen3-0.6b"),
         "gemma3": ("gemma3-12b", "gemma3-1b")}  # --pair -> LLM, SLM
NAMES = {"qwen2": "Qwen2 7B (LLM) / 1.5B (SLM)", "qwen3": "Qwen3-8B (LLM) / Qwen3-0.6B (SLM)",
         "qwen3-moe": "Qwen3-30B-A3B (LLM, MoE) / Qwen3-0.6B (SLM)", "gemma3": "Gemma 3 12B (LLM) / 1B (SLM), hybrid attention"}
VARIANTS = {"auto": AUTO, "graphs": FastConfig(), "graphs-batched-experts": FastConfig(experts="batched_mm"), "parts": FastConfig(compile="parts"), "compiled-decode": FastConfig(compile="decode"),
            "graphs-matmul": FastConfig(attention="matmul")}


def random_model(name: str, device: str = "cuda"):
    """A random-weight bf16 model of :data:`engine_shapes.SHAPES` ``[name]`` on ``device``; on the CPU, a few-MB
    model of the same architecture with six layers (Gemma 3's sliding and full attention both present)."""
    return engine_shapes.build(name, device, seed=0, layers=6 if device == "cpu" else None, tiny=device == "cpu")


def expert_shares(model, tokens: int = 512) -> list[list[float]] | None:
    """Per MoE layer, each expert's share of tokens (the chance a token selects it) on ``tokens`` random ids, read
    from the experts' routing arguments (None for a dense model)."""
    from hf_rstitch.fast.patches import experts

    modules = experts.expert_modules(model)
    if not modules:
        return None
    picks = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: picks.append(args[1].reshape(-1, args[1].shape[-1])))
             for m in modules]
    try:
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=model.device)
        model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    n = modules[0].num_experts
    return [(torch.bincount(p.reshape(-1), minlength=n).float() / p.shape[0]).tolist() for p in picks]


def model_facts(model) -> dict:
    """Bytes a decode step reads: ``lab.weight_bytes``, the KV bytes of a token, and for an MoE model its dense
    bytes, the bytes of one expert of one layer and the experts' shares (:func:`expert_shares`)."""
    from hf_rstitch.fast.patches import experts
    from hf_rstitch.fast.windows import layer_windows

    facts = {**lab.weight_bytes(model), "kv_bytes_per_token": kv_bytes_per_token(model),
             "windows": layer_windows(model.config)}
    modules = experts.expert_modules(model)
    if modules:
        total = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
        facts["expert_bytes"] = total // (len(modules) * modules[0].num_experts)
        facts["dense_read_bytes"] = facts["decode_read_bytes"] - total
        facts["expert_shares"] = expert_shares(model)
    return facts


def step_read_bytes(f: dict, rows: int) -> float:
    """Weight bytes one step over ``rows`` rows reads: all of a dense model; an MoE model's dense weights plus the
    expected distinct experts of each layer."""
    if "expert_shares" not in f:
        return f["decode_read_bytes"]
    distinct = sum(1 - (1 - q) ** rows for layer in f["expert_shares"] for q in layer)
    return f["dense_read_bytes"] + distinct * f["expert_bytes"]


def kv_read_bytes(f: dict, length: int) -> float:
    """KV bytes one row at ``length`` columns reads: every written slot of a full layer, a window's of a sliding one."""
    layers = f["windows"]
    per_layer = f["kv_bytes_per_token"] / len(layers)
    return per_layer * sum(length if w is None else min(length, w) for w in layers)


def stitched_routes(batch: int, scale: float) -> list[list[str]]:
    llm, slm = round(MATH["llm_tokens"] * scale), round(MATH["slm_tokens"] * scale)
    return [route(llm + slm, llm, MATH["llm_run"], seed=100 + r) for r in range(batch)]


def floor_seconds(routes: list[list[str]], prompt: int, facts: dict, bw: float) -> float:
    """Bytes the route's forwards must read over the copy bandwidth (see the module docstring)."""
    total = 0.0
    alone = [len(set(r)) == 1 for r in routes]  # one model alone: it runs every step
    for i in range(len(routes[0])):
        for role in ("slm", "llm"):
            need = [r for r, one in zip(routes, alone) if (r[0] == role if one else _needs(r, i, role))]
            if need:
                f = facts[role]
                total += step_read_bytes(f, len(need)) + len(need) * kv_read_bytes(f, prompt + i)
    return total / (bw * 1e9)


def _needs(roles: list[str], i: int, model: str) -> bool:
    if model == "llm":
        return roles[i] == "llm"
    return roles[i] == "slm" or (i == 0 or roles[i - 1] == "slm")  # its token, or a proposal it hands over


DECISIONS = "host"  # where the replayed routes' decisions come back (--decisions)


def decisions_device(ids):
    """Where a replay's decisions come back (``--decisions``): the host, or the GPU as an entropy policy's."""
    return ids.device if DECISIONS == "device" else None


def generate(llm, slm, ids, routes, engine, new, policy=None):
    """``new`` tokens of ``routes`` under ``policy`` (default: their replay)."""
    policy = ReplayPolicy(routes, device=decisions_device(ids)) if policy is None else policy
    return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                        stitch_policy=policy, stitch_engine=engine, max_new_tokens=new,
                        do_sample=False, return_dict_in_generate=True)


def fast_section(llm, slm, args, res, budget):
    # lanes for up to 64 rows first (as before B = 128, 256 came); a larger batch rebuilds them for its rows
    first = max([b for b in args.batches if b <= 64] or [min(args.batches)])
    engine = FastEngine(VARIANTS[args.variant], capacity=capacity(args), max_batch=first)
    res["variant"] = {"name": args.variant, "config": repr(engine.config), "pdl": args.pdl, "decisions": args.decisions,
                      "policies": args.policies}
    routed = lab.RoutedPair(llm, slm, rows=max(args.batches + [first]), positions=capacity(args))  # graphs record it
    from hf_rstitch.fast.patches import experts
    res["experts"] = experts.plan(llm, engine.config.experts).kind
    for batch in args.batches:
        if not budget.allows(30):
            res["skipped"].append(f"fast B={batch}: time budget")
            continue
        try:
            fast_batch(llm, slm, args, res, engine, batch, routed)
        except torch.cuda.OutOfMemoryError as err:  # B = 256 at full scale on an 80 GB card: say so, go on
            res["skipped"].append(f"fast B={batch}: out of GPU memory ({str(err).splitlines()[0][:200]})")
            print(f"[skip B={batch}] out of memory", flush=True)
            engine._lanes.clear()
            torch.cuda.empty_cache()
    res["lane_rows"] = {str(r): lane.max_rows for r, lane in engine._lanes.items()}
    routed.close()
    del engine
    gc.collect()
    torch.cuda.empty_cache() if DEVICE == "cuda" else None


def fast_batch(llm, slm, args, res, engine, batch, routed):
    """Both methods (and the SLM alone where asked) at one batch size, after capturing its bucket's graphs; the
    stitched routes under each policy of ``--policies``, the models alone replayed."""
    facts = res["models"]
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)  # ids both models embed
    ids = lab.prompt_ids(vocab, args.prompt, DEVICE).expand(batch, -1).contiguous()
    ids = (ids + torch.arange(batch, device=ids.device)[:, None]) % vocab  # rows differ
    sec_build, _ = timed(lambda: generate(llm, slm, ids, [["slm", "llm"]], engine, 2))  # builds / captures
    warm = sum(lane.warm_up(batch_sizes=[bucket_for(batch, lane.rows.sizes)]) for lane in engine._lanes.values())
    res["warm_up"].append({"batch": batch, "first_call_s": sec_build, "warm_up_every_bucket_s": warm,
                           "graphs": engine.graph_count(), "capture_s": engine.capture_seconds()})
    print(f"[warm B={batch}] {res['warm_up'][-1]}", flush=True)
    methods = [("llm_only", "replay")] + [("stitched", p) for p in args.policies] + (
        [("slm_only", "replay")] if batch in args.slm_only_batches else [])
    for method, name in methods:
        if method.endswith("_only"):
            n = round(MATH["llm_only_tokens"] * args.scale)
            routes = [[method[:3]] * n] * batch
        else:
            routes = stitched_routes(batch, args.scale)
            n = len(routes[0])
        policy = routed.policy(name, routes, args.prompt, decisions_device(ids))
        if name == "router":  # its SLM steps return hidden states: graphs the warm-up did not capture
            generate(llm, slm, ids, routes, engine, n, policy)
        sec, out = timed(lambda: generate(llm, slm, ids, routes, engine, n, policy))
        traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
        row = {"batch": batch, "method": method, "policy": name, "seconds": sec,
               "floor_seconds": floor_seconds(routes, args.prompt, facts, res["bandwidth_gbps"]),
               "new_tokens_per_row": n, "ms_per_step": 1e3 * sec / n,
               "llm_forward_calls_row0": traces[0].summary()["llm_forward_calls"],
               "slm_forward_calls_row0": traces[0].summary()["slm_forward_calls"],
               "switches_row0": switches(routes[0]),
               "roles_match": all([str(r) for r in t.roles] == routes[i] for i, t in enumerate(traces)),
               "row_moves": {str(k): v.row_moves for k, v in engine._lanes.items()}}
        row["x_floor"] = row["seconds"] / row["floor_seconds"]
        res["rows"].append(row)
        print(f"[{method} {name} B={batch}] {row}", flush=True)
        res["save"]()


def capacity(args) -> int:
    return args.prompt + round(MATH["llm_only_tokens"] * args.scale) + 8


def experts_section(llm, slm, args, res, budget):
    """An MoE LLM alone under each on-device experts dispatch (``FastConfig.experts``), at each of
    ``--experts-batches``: ``--experts-steps`` tokens after a warm-up, ms a step against the floor."""
    from dataclasses import replace

    from hf_rstitch.fast.patches import experts

    if not experts.expert_modules(llm):
        return
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    n, batches = args.experts_steps, args.experts_batches
    kinds = sorted(args.experts_dispatches or experts.DISPATCHES, key=lambda k: k != experts.expert_gemv.NAME)
    for kind, setting in [(k, t) for k in kinds for t in args.experts_settings]:  # ours first: the budget
        router = setting != "model-router"
        experts.expert_gemv.BY_EXPERT = setting != "pair-kernels"  # read when a forward runs (captured per engine)
        engine = FastEngine(replace(VARIANTS[args.variant], experts=kind, fuse_router=router),
                            capacity=args.prompt + n + 8, max_batch=max(batches))
        for batch in batches:
            if not budget.allows(25):
                res["skipped"].append(f"experts {kind} B={batch}: time budget")
                continue
            ids = lab.prompt_ids(vocab, args.prompt, DEVICE).expand(batch, -1).contiguous()
            ids = (ids + torch.arange(batch, device=ids.device)[:, None]) % vocab  # rows differ
            row = {"experts": kind, "setting": setting, "batch": batch, "steps": n}
            try:
                row["first_call_s"], _ = timed(lambda: generate(llm, slm, ids, [["llm"] * 8] * batch, engine, 8))
                sec, _ = timed(lambda: generate(llm, slm, ids, [["llm"] * n] * batch, engine, n))
                row["ms_per_step"] = 1e3 * sec / n
                row["floor_ms"] = 1e3 * (step_read_bytes(res["models"]["llm"], batch) + batch * kv_read_bytes(
                    res["models"]["llm"], args.prompt + n // 2)) / (res["bandwidth_gbps"] * 1e9)
            except Exception as err:  # a dispatch that cannot be captured here: say so, keep the run
                row["error"] = f"{type(err).__name__}: {err}"[:500]
            if args.experts_profile and batch == 1 and "error" not in row:
                try:
                    row["kernels"] = kernel_profile(lambda: generate(llm, slm, ids, [["llm"] * 16], engine, 16), 16)
                except Exception as err:  # the profile is extra: its failure keeps the timings
                    row["kernels"] = [[f"profile failed: {type(err).__name__}: {err}"[:200], 0]]
            res["experts_dispatch"].append(row)
            print(f"[experts {kind}] {row}", flush=True)
        del engine
        experts.expert_gemv.BY_EXPERT = True
        gc.collect()  # lanes and graphs may hold each other: free the engine's memory before the next one
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
        res["save"]()


def kernel_profile(run, steps: int, top: int = 14) -> list:
    """Device microseconds a step of ``run`` (``steps`` steps) spends per kernel name, the ``top`` largest
    (torch.profiler; kernels replayed inside CUDA graphs included), plus the sum of all."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name[:60]] = totals.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return [["all kernels", round(sum(totals.values()), 1)]] + [[k, round(v, 1)] for k, v in ranked[:top]]


def baseline_section(llm, args, res, budget):
    """transformers, LLM alone: plain generate (DynamicCache) and the static cache (compiled by generate)."""
    n = args.baseline_new
    for kind, kw, batches in (("plain", {}, args.batches), ("static", {"cache_implementation": "static"},
                                                             args.static_batches)):
        for batch in batches:
            if not budget.allows(40 if kind == "plain" else 120):
                res["skipped"].append(f"transformers {kind} B={batch}: time budget")
                continue
            ids = lab.prompt_ids(llm.config.vocab_size, args.prompt, DEVICE).expand(batch, -1).contiguous()
            row = {"batch": batch, "method": f"llm_only_transformers_{kind}", "new_tokens_measured": n}
            try:
                first, _ = timed(lambda: llm.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **kw))
                sec, _ = timed(lambda: llm.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw))
                row.update(first_call_s=first, seconds_measured=sec, ms_per_step=1e3 * sec / n,
                           seconds=sec * MATH["llm_only_tokens"] / n, extrapolated=True)
            except Exception as err:  # keep the run going; record what broke
                row["error"] = f"{type(err).__name__}: {err}"[:1000]
            res["transformers"].append(row)
            print(f"[transformers {kind} B={batch}] {row}", flush=True)
            res["save"]()


def markdown(res) -> str:
    d = res["device"]
    shapes = NAMES[res["args"].get("pair", "qwen2")]
    lines = [f"# Batched fast engine, MATH-shaped workload: random {shapes}, bf16, {d['name']}", "",
             f"torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, {res['date']}; "
             f"variant `{res.get('variant', {}).get('name')}`; prompt {res['args']['prompt']} tokens per row; "
             f"copy bandwidth {res['bandwidth_gbps']:.0f} GB/s (read + write). Per row: LLM alone "
             f"{round(MATH['llm_only_tokens'] * res['args']['scale'])} tokens; stitched "
             f"{round(MATH['llm_tokens'] * res['args']['scale'])} LLM + {round(MATH['slm_tokens'] * res['args']['scale'])} "
             "SLM tokens, LLM runs of ~4, independent routes per row. Policies: `entropy` and `router` decide the "
             f"routes from the models' entropies, forced to follow them (threshold {lab.TAU}): their decisions come "
             "from the device; `replay` replays them, decisions "
             + ("on the device, as an entropy policy's (`--decisions device`): the loop reads them from the GPU and "
                "cannot run the LLM ahead." if res.get("variant", {}).get("decisions") == "device" else
                "on the host (no device read for them): the bound."), "",
             "| B | policy | LLM alone (s) | x floor | stitched (s) | x floor | vs replay | stitched speed-up | "
             "LLM ms/step | plain generate, LLM (s, extrap.) | static generate, LLM (s, extrap.) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["batch"], r["method"], r.get("policy", "replay")): r for r in res["rows"] + res["transformers"]}
    for batch in res["args"]["batches"]:
        for policy in res["args"].get("policies", ["replay"]):
            lo, st = by.get((batch, "llm_only", "replay")), by.get((batch, "stitched", policy))
            rp = by.get((batch, "stitched", "replay"))
            pl = by.get((batch, "llm_only_transformers_plain", "replay"))
            sc = by.get((batch, "llm_only_transformers_static", "replay"))
            cell = lambda r, k, f: f.format(r[k]) if r and k in r else "-"  # noqa: E731
            speed = f"{lo['seconds'] / st['seconds']:.2f}x" if lo and st else "-"
            vs = f"{st['seconds'] / rp['seconds']:.3f}" if st and rp else "-"
            met = "" if not st or st.get("roles_match", True) else " (route not met)"
            lines.append(f"| {batch} | {policy}{met} | {cell(lo, 'seconds', '{:.2f}')} | {cell(lo, 'x_floor', '{:.2f}')} | "
                         f"{cell(st, 'seconds', '{:.2f}')} | {cell(st, 'x_floor', '{:.2f}')} | {vs} | {speed} | "
                         f"{cell(lo, 'ms_per_step', '{:.2f}')} | {cell(pl, 'seconds', '{:.1f}')} | "
                         f"{cell(sc, 'seconds', '{:.1f}')} |")
    for r in res["rows"]:
        if r["method"] == "slm_only":
            lines.append(f"\nSLM alone, B={r['batch']}: {r['ms_per_step']:.2f} ms/step, {r['x_floor']:.2f}x its floor.")
    llm = res["models"]["llm"]
    if "expert_shares" in llm:
        lines.append(f"\nMoE floor: LLM dense weights {llm['dense_read_bytes'] / 1e9:.2f} GB a step, one expert of one layer "
                     f"{llm['expert_bytes'] / 1e6:.2f} MB; experts read per step (expected distinct, all layers): "
                     + ", ".join(f"B={b}: {(step_read_bytes(llm, b) - llm['dense_read_bytes']) / 1e9:.2f} GB"
                                 for b in res["args"]["batches"]) + f"; dispatch `{res.get('experts')}`.")
    for r in res.get("experts_dispatch", []):
        router = {"all": ", router kernels, several rows by expert", "model-router": ", the routers' own code",
                  "pair-kernels": ", router kernels, pair kernels at every batch"}.get(r.get("setting"), "")
        lines.append(f"\nLLM alone, B={r.get('batch', 1)}, experts dispatch `{r['experts']}`{router}: " + (
            f"{r['ms_per_step']:.2f} ms/step, {r['ms_per_step'] / r['floor_ms']:.2f}x its floor ({r['floor_ms']:.2f} ms)"
            if "ms_per_step" in r else f"failed: {r.get('error')}"))
        if r.get("kernels"):
            lines.append("device us a step by kernel: " + "; ".join(f"{k} {v}" for k, v in r["kernels"]))
    lines += ["", "Warm-up per batch size (graphs captured for the batch bucket, every length bucket, both lanes):", ""]
    lines += [f"- B={w['batch']}: {w['warm_up_every_bucket_s']:.1f} s (first call {w['first_call_s']:.1f} s), "
              f"{w['graphs']} graphs in all" for w in res["warm_up"]]
    if res["skipped"]:
        lines += ["", "Skipped: " + "; ".join(res["skipped"])]
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    """``path``'s results (an engine_batched JSON) as a figure next to it: each method's time over its floor,
    and stitched decoding's speed-up over the LLM alone, per batch size, with the issue's targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(path.read_text())
    shown = res["args"].get("policies", ["replay"])[0]  # the stitched rows of the first policy
    rows = {(r["batch"], r["method"]): r for r in res["rows"]
            if r["method"] == "llm_only" or (r["method"] == "stitched" and r.get("policy", "replay") == shown)}
    batches = sorted({b for b, _ in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.4))
    for method, label in (("llm_only", "LLM alone"), ("stitched", "stitched")):
        got = [(b, rows[b, method]["seconds"] / rows[b, method]["floor_seconds"]) for b in batches if (b, method) in rows]
        left.plot([str(b) for b, _ in got], [x for _, x in got], "o-", label=label)
    left.axhline(1.3, color="k", ls="--", lw=0.8, label="target, LLM alone (1.3x)")
    left.set_xlabel("batch size")
    left.set_ylabel("wall time / floor")
    left.set_ylim(1.0, None)
    left.legend(fontsize=8)
    both = [b for b in batches if (b, "llm_only") in rows and (b, "stitched") in rows]
    speed = [rows[b, "llm_only"]["seconds"] / rows[b, "stitched"]["seconds"] for b in both]
    right.bar([str(b) for b in both], speed, color="tab:green")
    right.plot([str(b) for b in both], [3.5 if b == 1 else 2.3 if b >= 128 else 1.5 for b in both], "k_", ms=28,
               mew=1.5, label="target")
    for i, v in enumerate(speed):
        right.annotate(f"{v:.2f}x", (i, v), ha="center", va="bottom", fontsize=8)
    right.set_xlabel("batch size")
    right.set_ylabel("stitched speed-up over the LLM alone")
    right.legend(fontsize=8)
    pair = {"qwen2": "Qwen2 7B / 1.5B", "qwen3": "Qwen3-8B / 0.6B", "qwen3-moe": "Qwen3-30B-A3B / 0.6B",
            "gemma3": "Gemma 3 12B / 1B"}
    fig.suptitle(f"Batched fast engine, MATH-shaped workload, {pair[res['args'].get('pair', 'qwen2')]} shapes, "
                 f"policy {shown} "
                 f"({res['device']['name']})", fontsize=10)
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256],
                    help="batch sizes, in order (past 64 rows the products are cuBLAS GEMMs: fast.gemv.GEMM_ROWS; at "
                         "--scale 1 B=256 needs about 68 GB of KV caches on the Qwen2 pair: an H200, or a smaller --scale; "
                         "a batch that runs out of memory is skipped, the reason recorded)")
    ap.add_argument("--static-batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--slm-only-batches", type=int, nargs="*", default=[1], help="also time the SLM alone here")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--baseline-new", type=int, default=128, help="new tokens for transformers' generate")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the MATH token counts (quick checks)")
    ap.add_argument("--variant", default="graphs", choices=list(VARIANTS))
    ap.add_argument("--pair", default="qwen2", choices=["qwen2", *PAIRS],
                    help="model shapes: Qwen2 7B / 1.5B, Qwen3-8B / 0.6B, Qwen3-30B-A3B / 0.6B (MoE) or Gemma 3 12B / "
                         "1B (hybrid)")
    ap.add_argument("--pdl", default=triton_support.PDL, choices=["off", "one-row", "all"],
                    help="programmatic dependent launch of the Triton kernels (hf_rstitch.fast.kernels.triton_support.PDL; default: its default)")
    ap.add_argument("--policies", nargs="+", default=["entropy", "replay"], choices=lab.POLICIES,
                    help="who decides the stitched routes (a row's policy field): entropy, router (R-Stitch+) or "
                         "replay (the bound); the LLM and the SLM alone are replayed")
    ap.add_argument("--decisions", default="host", choices=["host", "device"],
                    help="where the replay's hand-over decisions come back: the host (no device read to "
                         "decide) or the GPU, as an entropy policy's do (the loop pays the reads it would)")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--experts-steps", type=int, default=0,
                    help="MoE LLM: also time this many steps under each on-device experts dispatch")
    ap.add_argument("--experts-profile", action="store_true",
                    help="MoE LLM: also profile 16 B = 1 steps of each dispatch (device us a step per kernel)")
    ap.add_argument("--experts-batches", type=int, nargs="+", default=[1],
                    help="MoE LLM: the batch sizes --experts-steps times")
    ap.add_argument("--experts-dispatches", nargs="+", default=None,
                    help="MoE LLM: the experts implementations --experts-steps times (default: every on-device one)")
    ap.add_argument("--experts-settings", nargs="+", default=["all"], choices=["all", "model-router", "pair-kernels"],
                    help="MoE LLM, rstitch_gemv: each setting timed -- all (router kernels, FastConfig.fuse_router; several "
                    "rows one program an expert, expert_gemv.BY_EXPERT), model-router (the routers' own code), "
                    "pair-kernels (the pair kernels at every batch size)")
    ap.add_argument("--experts-first", action="store_true", help="MoE LLM: the --experts-steps section before the "
                    "batched runs (a short budget spends itself on it first)")
    ap.add_argument("--experts-only", action="store_true",
                    help="MoE LLM: only the --experts-steps section (no batched runs, no baselines)")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--tag", default="")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script, times nothing")
    lab.add_profile(ap)
    args = ap.parse_args()
    args.suffix = lab.apply_profile(args.profile)  # before anything compiles; child processes inherit it
    triton_support.PDL = args.pdl
    global DECISIONS, DEVICE
    DECISIONS = args.decisions
    if args.dry_run_cpu:
        DEVICE = "cpu"
        for cfg in VARIANTS.values():
            object.__setattr__(cfg, "graphs", False)
    budget = lab.Budget(args.budget_s)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu dry run"
    res = {"device": {"name": name, "capability": torch.cuda.get_device_capability() if DEVICE == "cuda" else None},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version()},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "args": vars(args),
           "rows": [], "transformers": [], "warm_up": [], "skipped": [], "experts_dispatch": []}
    res["bandwidth_gbps"] = bw = lab.copy_bandwidth(DEVICE)
    if args.pair == "qwen2":
        llm, slm = lab.random_pair("qwen2" if DEVICE == "cuda" else "tiny", DEVICE)
    else:
        llm, slm = (random_model(name, DEVICE) for name in PAIRS[args.pair])
    models = {"slm": slm, "llm": llm}
    res["models"] = {}
    with torch.no_grad():
        for tag, m in models.items():
            m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0  # random weights: no early stop
            res["models"][tag] = model_facts(m)
    print(f"[setup] {res['device']} bw={bw:.0f} GB/s {res['models']}", flush=True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    pair = "" if args.pair == "qwen2" else f"_{args.pair.replace('-', '_')}"
    stem = out_dir / f"engine_batched{pair}_{gpu}{args.tag}{args.suffix}"

    def save():
        clean = {k: v for k, v in res.items() if k != "save"}
        stem.with_suffix(".json").write_text(json.dumps(clean, indent=1, default=str))
        stem.with_suffix(".md").write_text(markdown(res))

    res["save"] = save
    llm, slm = models["llm"], models["slm"]
    with torch.no_grad():
        if args.experts_steps and args.experts_first:
            experts_section(llm, slm, args, res, budget)
        t0 = time.perf_counter()
        if not args.experts_only:
            fast_section(llm, slm, args, res, budget)
        res["fast_section_s"] = time.perf_counter() - t0
        if args.experts_steps and not args.experts_first:
            experts_section(llm, slm, args, res, budget)
        if not (args.skip_baselines or args.experts_only):
            baseline_section(llm, args, res, budget)
    save()
    plot(stem.with_suffix(".json"))
    print(markdown(res))
    print(json.dumps({"device": name, "rows": [{k: r[k] for k in ("batch", "method", "policy", "seconds", "floor_seconds")}
                                               for r in res["rows"]]}))


if __name__ == "__main__":
    main()
