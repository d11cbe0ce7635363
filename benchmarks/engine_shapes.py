"""Per-token cost, first call and the MATH-shaped pair speed-up of the ``"auto"`` engine over real model shapes.

    PYTHONPATH=.:benchmarks python benchmarks/engine_shapes.py --out-dir $OUT [--fresh] [--budget-s 290]
        [--models qwen3-0.6b ...] [--pairs qwen3-8b/qwen3-0.6b ...] [--scale 1.0]
    PYTHONPATH=.:benchmarks python benchmarks/engine_shapes.py --dry-run-cpu --out-dir /tmp/s   # checks the script

The question (issue 39, items 1, 3 and 4): how far from its floor is each model shape at batch 1, how long
does a first call take, and how much faster is stitched decoding than the LLM alone on the paper's MATH row?
Weights are random, bf16, made directly on the GPU from the published configs' dimensions (:data:`SHAPES`).
Everything runs through ``generate(..., stitch_engine="auto")``, each model or pair in its own fresh Python process,
one after another, under each policy of ``--policies`` (a row's ``policy`` field): ``entropy``, the R-Stitch rule
(:class:`hf_rstitch.EntropyPolicy`, threshold :data:`lab.TAU`) and ``router``, R-Stitch+ (a random router of the
paper's size that votes for the LLM wherever it is asked; the stitched route only) decide the route themselves
from the models' entropies, which :class:`lab.RoutedPair` forces to follow it (the path a user's call runs: the
fast engine reads their decisions a step late, guessing the next step and rolling it back at a hand-over where that
pays, :mod:`hf_rstitch.decode.loop`);
``replay`` replays it (:class:`hf_rstitch.ReplayPolicy`, no policy: the bound the others approach). Every policy
runs on the same forced models (a few small kernels a forward of both); ``roles_match`` says the route was met.

* a row: a model alone, ``ms_per_token`` as the difference of two calls of ``--new`` and ``--new // 2`` tokens
  over the difference in tokens (prompt prefill and call set-up cancel; the faster of two runs each), and
  ``floor_ms``: the weight bytes a token reads (tied embeddings once, the untied input embedding not at all: one
  row a token; the lm_head every token) over the measured device-to-device copy bandwidth. The two models of a
  pair (``--pairs``) are measured in the pair's process (as its LLM and SLM lanes; ``first_call_s`` is the pair's);
  another model (``--models``, e.g. qwen3-1.7b) in a process of its own, as the SLM if it is a small one, else as
  the LLM, beside a one-layer partner of the same dimensions (``generate`` always builds both lanes; the partner's
  costs a layer's graphs and compiles the same shapes), ``first_call_s`` its first ``generate``.
* a pair (``--pairs``): the paper's MATH row (7B pair, 8k budget): the LLM alone writes 2753 tokens; stitched,
  344 LLM + 771 SLM tokens in LLM runs of ~4 (:func:`engine_batched.stitched_routes`), times ``--scale``.
  ``first_call_s``: the process's first ``generate`` (a 4-token stitched route: lanes built, pieces compiled, graphs
  captured); ``first_route_s``: the first
  MATH-route call after it (any bucket its hand-overs need for the first time is captured inside it);
  ``stitched_s``: the same route again (median of two), per policy; ``llm_alone_s``: the LLM alone (replayed: no
  hand-over to decide). Floors:
  :func:`engine_batched.floor_seconds` (weights each forward needs plus the KV cache it reads, over the copy bandwidth).

Caches: ``--fresh`` gives every process its own empty ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and GEMV
tuning table, so its first call is what a fresh machine with the package installed pays (``fresh_machine: true``;
the package's shipped tuning tables and Triton kernels are read, as there); without it the processes
use the machine's caches, and ``fresh_machine`` is true only where those were empty when the process started.
The engine's capacity is set before the first call (``FastEngine.capacity`` of the engine ``"auto"`` keeps on
the LLM) so no later call of the process rebuilds a lane. A process that does not fit what is left of
``--budget-s`` is skipped and recorded. Writes ``engine_shapes_<gpu>.json`` (``rows``, ``pairs``, device,
versions, date) and ``.md``; prints the table and one compact JSON document last.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import lab

QWEN3 = dict(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1e6)
QWEN2 = dict(max_position_embeddings=32768, rope_theta=1e6)
LLAMA3 = dict(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
              rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=None, low_freq_factor=1.0,
                                   high_freq_factor=4.0, original_max_position_embeddings=8192))
# name -> (transformers config class, fields): the published configs' dimensions
SHAPES = {
    "qwen3-0.6b": ("Qwen3Config", dict(QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)),
    "qwen3-1.7b": ("Qwen3Config", dict(QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)),
    "qwen3-8b": ("Qwen3Config", dict(QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)),
    "qwen2-1.5b": ("Qwen2Config", dict(QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True)),
    "qwen2-7b": ("Qwen2Config", dict(QWEN2, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False)),
    "llama3.2-1b": ("LlamaConfig", dict(LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                        tie_word_embeddings=True, rope_parameters={**LLAMA3["rope_parameters"],
                                                                                   "factor": 32.0})),
    "llama3.1-8b": ("LlamaConfig", dict(LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                        tie_word_embeddings=False, rope_parameters={**LLAMA3["rope_parameters"],
                                                                                    "factor": 8.0})),
    # engine_batched.py's MoE and hybrid-attention pairs (Qwen3-0.6B is the MoE's SLM)
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(QWEN3, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                             num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                             num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                             tie_word_embeddings=False)),
    "gemma3-12b": ("Gemma3TextConfig", dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360,
                                            num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                                            head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
                                            max_position_embeddings=131072)),
    "gemma3-1b": ("Gemma3TextConfig", dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                                           num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                                           head_dim=256, sliding_window=512, query_pre_attn_scalar=256,
                                           max_position_embeddings=32768)),
}
PAIRS = ["qwen3-8b/qwen3-0.6b", "qwen2-7b/qwen2-1.5b", "llama3.1-8b/llama3.2-1b"]  # LLM/SLM
SLMS = {p.split("/")[1] for p in PAIRS} | {"qwen3-1.7b"}  # rows run these as the SLM
ROWS_ORDER = ["qwen3-0.6b", "qwen2-1.5b", "llama3.2-1b", "qwen3-1.7b", "qwen3-8b", "qwen2-7b", "llama3.1-8b"]
NEED_S = {"row": 25, "pair": 60}  # seconds a process needs at least (warm caches): no start with less left


# ---- models -------------------------------------------------------------------------------------------------
def build(name: str, device: str, seed: int = 0, layers: int | None = None, tiny: bool = False):
    """A random-weight bf16 model of ``SHAPES[name]`` made on ``device`` (``layers``: fewer layers; ``tiny``: a
    few-MB model of the same architecture, for ``--dry-run-cpu``)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cls, fields = SHAPES[name]
    fields = dict(fields)
    if tiny:
        fields.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=512)
        fields.update({k: v for k, v in (("moe_intermediate_size", 32), ("num_experts", 8), ("sliding_window", 8))
                       if k in fields})
    if layers is not None:
        fields["num_hidden_layers"] = layers
    config = getattr(transformers, cls)(**fields)
    config._name_or_path = f"random-{name}"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0  # no early stop
    return model


# ---- one child process --------------------------------------------------------------------------------------
class Warnings(logging.Handler):
    """The warnings hf_rstitch logs (an ``"auto"`` fallback to the eager engine says why here)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage()[:500])


def child(args) -> dict:
    import torch

    import hf_rstitch  # noqa: F401  (patches generate)
    from hf_rstitch.fast.engine import ATTRIBUTE, AUTO, engine_for

    warnings = Warnings()
    logging.getLogger("hf_rstitch").addHandler(warnings)
    device = "cpu" if args.dry_run_cpu else "cuda"
    t0 = time.perf_counter()
    if args.kind == "pair":
        llm_name, slm_name = args.what.split("/")
        llm, slm = build(llm_name, device, 0, tiny=args.dry_run_cpu), build(slm_name, device, 1, tiny=args.dry_run_cpu)
    else:
        layers = 1 if not args.dry_run_cpu else None
        model = build(args.what, device, 0, tiny=args.dry_run_cpu)
        partner = build(args.what, device, 1, layers, args.dry_run_cpu)
        llm, slm = (partner, model) if args.what in SLMS else (model, partner)
    res = {"environment": lab.environment([device]), "build_s": time.perf_counter() - t0,
           "bandwidth_gbps": lab.copy_bandwidth(device)}
    ids = lab.prompt_ids(min(llm.config.vocab_size, slm.config.vocab_size), args.prompt, device)
    longest = max(args.new, 0 if args.kind == "row" else round(lab.MATH["llm_only_tokens"] * args.scale))
    engine_for(llm, AUTO).capacity = args.prompt + longest + 8  # no later call of this process rebuilds a lane
    routed = lab.RoutedPair(llm, slm, rows=1, positions=args.prompt + longest + 8)

    def generate(roles, n, policy):
        """The call decoding ``roles`` (``n`` tokens) under ``policy``, ready to time (the policy made first)."""
        chosen = routed.policy(policy, roles, args.prompt)
        return lambda: llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                                    stitch_policy=chosen, stitch_engine="auto", max_new_tokens=n, do_sample=False,
                                    return_dict_in_generate=True)

    with torch.no_grad():
        first, report = generate(["slm", "llm", "slm", "llm"], 4, args.policies[0]), None
        if args.profile_first:  # host profile (slows the Python-heavy parts: for where, not how long)
            first, report = lab.host_profiled(first, args.profile_first)
        res["first_call_s"], _ = lab.timed(first, device)
        if report is not None:
            res["first_call_profile"] = report()
        res["caches_after_first"] = cache_files()
        res["build_seconds"] = {role.value: dict(lane.build_seconds)  # where the first call's lane builds went
                                for role, lane in getattr(engine_for(llm, AUTO), "_lanes", {}).items()}
        engine = llm.__dict__.get(ATTRIBUTE, {}).get(AUTO)
        res["engine"] = "fast" if engine is not None and engine._lanes else "eager"
        res["config"] = repr(AUTO)
        (row_section if args.kind == "row" else pair_section)(args, llm, slm, generate, device, res)
        res["graphs"] = engine.graph_count() if engine is not None else 0
    res["warnings"] = warnings.messages
    return res


def cache_files() -> dict[str, int]:
    """Files in this process's compile caches now (after the first call: what it compiled, the seeded assets
    included)."""
    dirs = cache_dirs()
    return {k: sum(1 for f in p.rglob("*") if f.is_file()) if p.is_dir() else int(p.exists())
            for k, p in dirs.items()}


def per_token(role: str, model, generate, args, device, bw: float, policy: str) -> dict:
    """``model`` (the lane ``role``) alone under ``policy``: ms a token as the difference of a ``--new`` and a
    ``--new // 2`` token call (the faster of two runs each), and its floor."""

    n, half = args.new, args.new // 2
    long_call, half_call = generate([role] * n, n, policy), generate([role] * half, half, policy)
    sec = min(lab.timed(long_call, device)[0] for _ in range(2))
    sec_half = min(lab.timed(half_call, device)[0] for _ in range(2))
    facts = lab.weight_bytes(model)
    return {"role": role, "policy": policy, **facts, "ms_per_token": 1e3 * (sec - sec_half) / (n - half),
            "call_ms_per_token": 1e3 * sec / n, "floor_ms": 1e3 * facts["decode_read_bytes"] / (bw * 1e9)}


def row_policies(args) -> list[str]:
    """The policies a model alone runs under: the router decides nothing there (its entropies never ask it)."""
    return [p for p in args.policies if p != "router"]


def row_section(args, llm, slm, generate, device, res) -> None:
    role = "slm" if args.what in SLMS else "llm"
    model = slm if role == "slm" else llm
    res["alone"] = [{"model": args.what, **per_token(role, model, generate, args, device, res["bandwidth_gbps"], p),
                     "partner": "one-layer copy of the shape"} for p in row_policies(args)]


def pair_section(args, llm, slm, generate, device, res) -> None:
    import engine_batched as ebt

    if res["engine"] != "fast" and not args.dry_run_cpu:  # the eager engine: minutes for the route, and not the question
        res["error"] = "the 'auto' engine ran the eager engine (see warnings): pair not timed"
        return
    names = dict(zip(("llm", "slm"), args.what.split("/")))
    res["alone"] = [{"model": names[role], **per_token(role, model, generate, args, device, res["bandwidth_gbps"], p)}
                    for p in row_policies(args) for role, model in (("slm", slm), ("llm", llm))]
    facts = {"llm": ebt.model_facts(llm), "slm": ebt.model_facts(slm)}
    stitched = ebt.stitched_routes(1, args.scale)
    alone = [["llm"] * round(lab.MATH["llm_only_tokens"] * args.scale)]
    res["stitched"] = {}
    for policy in args.policies:  # each policy: a first call (any bucket its hand-overs need), then the timed two
        call = generate(stitched[0], len(stitched[0]), policy)
        first, _ = lab.timed(call, device)
        sec, out = lab.timed(call, device, repeats=2)
        res["stitched"][policy] = {"first_route_s": first, "stitched_s": sec, "roles_match": lab.roles_match(out, stitched)}
    lab.timed(generate(alone[0][:16], 16, "replay"), device)
    res["llm_alone_s"], _ = lab.timed(generate(alone[0], len(alone[0]), "replay"), device)
    bw = res["bandwidth_gbps"]
    res["stitched_floor_s"] = ebt.floor_seconds(stitched, args.prompt, facts, bw)
    res["llm_alone_floor_s"] = ebt.floor_seconds(alone, args.prompt, facts, bw)
    res["speedup_at_floors"] = res["llm_alone_floor_s"] / res["stitched_floor_s"]
    res["route"] = {"llm_tokens": stitched[0].count("llm"), "slm_tokens": stitched[0].count("slm"),
                    "switches": lab.switches(stitched[0]), "llm_alone_tokens": len(alone[0]), "scale": args.scale}


# ---- the parent: fresh processes one after another ---------------------------------------------------------
def cache_dirs() -> dict[str, Path]:
    """The compile caches a child without ``--fresh`` uses: inductor's (as hf_rstitch.fast.compile_cache picks
    it), Triton's and the GEMV tuning table."""
    from hf_rstitch.fast import compile_cache
    from hf_rstitch.fast.kernels import tuning_cache

    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.environ.get(compile_cache.ENV) or compile_cache.default_dir()
    triton = os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"
    tuning = tuning_cache.default_path() or Path("/nonexistent")  # memory only: nothing carried over
    return {"inductor": Path(inductor), "triton": Path(triton), "tuning": tuning}


def empty(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def spawn(args, kind: str, what: str, root: Path, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--what", what, "--prompt", str(args.prompt),
           "--new", str(args.new), "--scale", str(args.scale), "--policies", *args.policies,
           "--profile-first", str(args.profile_first)] + (
        ["--dry-run-cpu"] if args.dry_run_cpu else [])
    env = dict(os.environ)
    if args.fresh:
        fresh = root / re.sub(r"[^a-z0-9.]+", "_", f"{kind}_{what}")
        env.update(TORCHINDUCTOR_CACHE_DIR=str(fresh / "inductor"), TRITON_CACHE_DIR=str(fresh / "triton"),
                   HF_RSTITCH_TUNING_CACHE=str(fresh / "gemv_tuning.json"))
        dirs = {"inductor": fresh / "inductor", "triton": fresh / "triton", "tuning": fresh / "gemv_tuning.json"}
    else:
        dirs = cache_dirs()
    caches = {k: {"dir": str(p), "empty": empty(p)} for k, p in dirs.items()}
    head = {"kind": kind, "what": what, "caches": caches, "fresh_machine": all(c["empty"] for c in caches.values())}
    return {**head, **lab.run_child(cmd, env, timeout)}


def to_rows(r: dict) -> list[dict]:
    """The rows of a process: its model alone, or a pair's two models each alone (their first call: the pair's),
    one a policy."""
    keep = ("role", "call_ms_per_token", "weight_bytes", "decode_read_bytes", "tied_embeddings", "partner")
    shared = ("bandwidth_gbps", "engine", "graphs", "caches", "process_s", "warnings", "error")
    models = r.get("alone") or [{"model": name, "policy": None} for name in r["what"].split("/")]  # failed: empty rows
    rows = []
    for m in models:
        row = {"model": m["model"], "policy": m["policy"], "batch": 1, "ms_per_token": m.get("ms_per_token"),
               "floor_ms": m.get("floor_ms"), "first_call_s": r.get("first_call_s"), "fresh_machine": r["fresh_machine"]}
        if row["ms_per_token"] and row["floor_ms"]:
            row["x_floor"] = row["ms_per_token"] / row["floor_ms"]
        row["first_call_of"] = r["what"]  # the process whose first generate it was (a pair: both lanes built)
        rows.append({**row, **{k: m[k] for k in keep if k in m}, **{k: r[k] for k in shared if k in r}})
    return rows


def to_pairs(r: dict) -> list[dict]:
    """A pair's process as one entry a policy (``vs_replay``: its stitched seconds over the replay's)."""
    llm, slm = r["what"].split("/")
    keep = ("stitched_floor_s", "llm_alone_floor_s", "speedup_at_floors", "first_call_s", "first_call_profile",
            "caches_after_first", "build_seconds", "route",
            "engine", "bandwidth_gbps", "graphs", "caches", "process_s", "warnings", "error")
    stitched = r.get("stitched") or {None: {}}  # a failed process: one empty entry
    replay = stitched.get("replay", {}).get("stitched_s")
    pairs = []
    for policy, got in stitched.items():
        sec, alone = got.get("stitched_s"), r.get("llm_alone_s")
        pair = {"llm": llm, "slm": slm, "policy": policy, "stitched_s": sec, "llm_alone_s": alone,
                "speedup": alone / sec if alone and sec else None, "vs_replay": sec / replay if sec and replay else None,
                "first_route_s": got.get("first_route_s"), "roles_match": got.get("roles_match"),
                "fresh_machine": r["fresh_machine"]}
        pairs.append({**pair, **{k: r[k] for k in keep if k in r}})
    return pairs


def markdown(doc: dict) -> str:
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [f"# The \"auto\" engine over model shapes: random weights, bf16, B = 1, {doc['device']}", "",
             f"torch {doc['versions']['torch']}, transformers {doc['versions']['transformers']}, {doc['date']}; "
             f"prompt {doc['args']['prompt']} tokens; each model or pair in a fresh process "
             f"({'own empty compile caches' if doc['args']['fresh'] else 'the machine caches'}). ms a token: the "
             f"difference of {doc['args']['new']}- and {doc['args']['new'] // 2}-token calls; floor: weight bytes "
             "a token reads over the copy bandwidth.", "",
             f"Policies: `entropy` and `router` decide the route from the models' entropies, forced to follow it "
             f"(threshold {lab.TAU}); `replay` replays it (the bound).", "",
             "| model | role | policy | ms a token | floor ms | x floor | first call (s) | of | fresh machine | engine |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        err = f" error: {r['error'].strip().splitlines()[-1][:80]}" if r.get("error") else ""
        lines.append(f"| {r['model']}{' *' if r.get('from_run') else ''} | {r.get('role', '-')} | "
                     f"{r.get('policy') or '-'} | {f(r['ms_per_token'])} | {f(r['floor_ms'])} | "
                     f"{f(r.get('x_floor'))} | {f(r['first_call_s'], 1)} | {r.get('first_call_of', '-')} | "
                     f"{r['fresh_machine']} | "
                     f"{r.get('engine', '-')}{err} |")
    scale = doc["args"]["scale"]
    m = {k: round(v * scale) for k, v in lab.MATH.items()}
    lines += ["", f"MATH-shaped route (scale {scale}): the LLM alone {m['llm_only_tokens']} tokens; stitched "
              f"{m['llm_tokens']} LLM + {m['slm_tokens']} SLM tokens, LLM runs of ~4. Floors: weights each "
              "forward needs plus its KV reads, over the copy bandwidth.", "",
              "| LLM / SLM | policy | stitched (s) | vs replay | floor (s) | LLM alone (s) | floor (s) | speed-up | "
              "at floors | first call (s) | first route call (s) | fresh machine |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in doc["pairs"]:
        err = f" error: {p['error'].strip().splitlines()[-1][:80]}" if p.get("error") else ""
        missed = "" if p.get("roles_match") is not False else " (route not met)"
        lines.append(f"| {p['llm']} / {p['slm']}{' *' if p.get('from_run') else ''}{err} | {p.get('policy') or '-'}"
                     f"{missed} | {f(p['stitched_s'])} | {f(p.get('vs_replay'), 3)} | {f(p.get('stitched_floor_s'))} | "
                     f"{f(p['llm_alone_s'])} | {f(p.get('llm_alone_floor_s'))} | {f(p['speedup'])}x | "
                     f"{f(p.get('speedup_at_floors'))}x | {f(p.get('first_call_s'), 1)} | "
                     f"{f(p.get('first_route_s'), 1)} | {p['fresh_machine']} |")
    earlier = sorted({r["from_run"] for r in doc["rows"] + doc["pairs"] if r.get("from_run")})
    if earlier:
        lines += ["", f"\\* kept from the run of {', '.join(earlier)} (`--merge`), with its caches."]
    if doc["skipped"]:
        lines += ["", "Skipped: " + "; ".join(doc["skipped"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--models", nargs="*", default=ROWS_ORDER, choices=list(SHAPES),
                    help="rows: each model alone (a model of a pair in --pairs is measured in the pair's process)")
    ap.add_argument("--pairs", nargs="*", default=PAIRS, choices=PAIRS, help="MATH-shaped stitched route per pair")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256, help="new tokens of a row's longer timed call")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the MATH route's token counts")
    ap.add_argument("--policies", nargs="+", default=list(lab.POLICIES), choices=lab.POLICIES,
                    help="who decides each route (a row's policy field): entropy, router (the pairs' stitched route "
                         "only) and replay (the bound); the first runs each process's first call")
    ap.add_argument("--fresh", action="store_true", help="every process its own empty compile / Triton caches")
    ap.add_argument("--budget-s", type=float, default=290, help="no process starts with less than it needs left")
    ap.add_argument("--merge", metavar="JSON", help="an earlier run's result on the same card: its rows and pairs "
                    "that this run does not measure are kept (marked with the earlier run's date)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script, times nothing")
    ap.add_argument("--profile-first", type=int, default=0, metavar="N",
                    help="each process's first call under cProfile: its N costliest functions in the JSON "
                         "(first_call_profile)")
    ap.add_argument("--child", choices=["row", "pair"], help=argparse.SUPPRESS)
    ap.add_argument("--what", help=argparse.SUPPRESS)
    lab.add_profile(ap)
    args = ap.parse_args()
    args.suffix = lab.apply_profile(args.profile)  # before anything compiles; child processes inherit it
    if args.child:
        args.kind = args.child
        print(lab.CHILD_RESULT + json.dumps(child(args), default=str), flush=True)
        return
    root = Path(tempfile.mkdtemp(prefix="rstitch_shapes_"))
    paired = {m for p in args.pairs for m in p.split("/")}
    jobs = [("pair", p) for p in args.pairs] + [("row", m) for m in args.models if m not in paired]
    doc = {"device": None, "versions": None, "date": None, "args": vars(args), "rows": [], "pairs": [], "skipped": []}
    start = time.perf_counter()
    for kind, what in jobs:
        left = args.budget_s - (time.perf_counter() - start)
        if left < NEED_S[kind] * (0.1 if args.dry_run_cpu else 1):
            doc["skipped"].append(f"{kind} {what}: time budget ({left:.0f} s left)")
            continue
        r = spawn(args, kind, what, root, timeout=left)
        print(json.dumps(r, default=str)[:1500], flush=True)
        if doc["device"] is None and "environment" in r:
            env = r["environment"]
            doc.update(device=env["devices"][0] if not args.dry_run_cpu else "cpu dry run", date=env["date"],
                       versions={k: env[k] for k in ("torch", "transformers", "python")})
        doc["rows"] += to_rows(r)
        if kind == "pair":
            doc["pairs"] += to_pairs(r)
        save(doc, args)
    merge(doc, args.merge)
    save(doc, args)
    print(markdown(doc))
    print(json.dumps({"device": doc["device"], "rows": [{k: r.get(k) for k in ("model", "policy", "ms_per_token",
                     "floor_ms", "first_call_s")} for r in doc["rows"]],
                      "pairs": [{k: p.get(k) for k in ("llm", "slm", "policy", "speedup", "vs_replay")}
                                for p in doc["pairs"]]}))


def merge(doc: dict, path: str | None) -> None:
    """Keep the rows and pairs of the earlier result at ``path`` (same card) that ``doc`` did not measure."""
    if not path or not Path(path).exists():
        return
    old = json.loads(Path(path).read_text())
    if doc["device"] is not None and old.get("device") != doc["device"]:
        doc["skipped"].append(f"--merge {path}: measured on {old.get('device')}, not merged")
        return
    policy = lambda r: r.get("policy", "replay")  # noqa: E731  (results from before the field: replays)
    have = {(r["model"], policy(r)) for r in doc["rows"]}
    doc["rows"] += [{**r, "policy": policy(r), "from_run": old.get("date")} for r in old.get("rows", [])
                    if (r["model"], policy(r)) not in have]
    have = {(p["llm"], p["slm"], policy(p)) for p in doc["pairs"]}
    doc["pairs"] += [{**p, "policy": policy(p), "from_run": old.get("date")} for p in old.get("pairs", [])
                     if (p["llm"], p["slm"], policy(p)) not in have]


def save(doc: dict, args) -> None:
    order = {m: i for i, m in enumerate(ROWS_ORDER)}
    doc["rows"].sort(key=lambda r: (order.get(r["model"], 99), lab.POLICIES.index(r.get("policy") or "replay")))
    if doc["device"] is None:  # nothing ran yet
        doc = {**doc, "device": "unknown", "versions": {"torch": "?", "transformers": "?"}, "date": "?"}
    gpu = re.sub(r"[^a-z0-9]+", "_", doc["device"].lower()).strip("_")
    lab.write_result(Path(args.out_dir) / f"engine_shapes_{gpu}{args.suffix}", doc, markdown(doc))


if __name__ == "__main__":
    main()
