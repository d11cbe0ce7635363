"""Serving reasoning traffic: the same server pinned to the LLM alone vs stitched, at each concurrency (issue #38).

    PYTHONPATH=. python benchmarks/serve_reasoning.py --out-dir $OUT --scale 0.05 \\
        --levels 1 8 32 64 128 256 --warmup-s 2.5 --window-s 4 --budget-s 235 --startup-s 45  # one GPU call, ~225 s
    PYTHONPATH=. python benchmarks/serve_reasoning.py --dry-run-cpu --out-dir /tmp/sr  # tiny pair on CPU, ~1 min

Requests are MATH-shaped (the paper's 7B pair, 8k budget): the LLM alone writes 2753 tokens a request;
stitched, 344 LLM + 771 SLM tokens in LLM runs of ~4. ``--scale`` multiplies every token count (prompt
included) equally for both methods so that the sweep fits one device call; each request's length is its mean
times a seeded factor in [0.5, 1.5] (the same factor for request ``i`` of both methods), so that a closed
loop's requests do not finish in lock-step. No EOS: a request runs to its ``max_tokens``.

Weights are random (Qwen2 7B / 1.5B shapes, bf16), so routes are replayed: every row slot replays its own
seeded route of that LLM share and run length (:class:`CyclicReplay`, cyclic in the engine's step index), with
the decisions returned on the device as an entropy policy's are. Both methods run the same server process
(:func:`serve_worker`: the request engine behind ``hf_rstitch.serve``'s app and draining uvicorn, as
``rstitch serve`` runs it), the LLM-only one with every request pinned to the LLM (``rstitch serve --pin llm``).

Per method: the server process loads the pair, warms every batch bucket up, measures the request engine alone
(no HTTP, :func:`serve_alone.engine_closed_loop`) at each concurrency on the same requests, then serves (with
``--frontend-procs 1`` the engine alone runs in a spawned process that exits before the engine process starts); the client
(``--client-procs`` processes of asyncio + httpx streaming clients) runs a closed loop at each concurrency:
``c`` clients, client ``k`` sending requests ``k, k + c, ...`` one after another (the engine alone's slot ``k``
the same). A level runs ``--warmup-s`` (excluded) then ``--window-s``; tokens/s counts the tokens received in
the window (completed or not), requests/s each request's share of its tokens received in it (no jumps of a whole
request in a short window), p50 / p99 the latencies of the requests completed in it, TTFT that of the requests
whose first token came in it -- the same rule for both methods and for the engine alone. The engine alone also
records its phase profile in the second half of each warm-up (:mod:`serve_alone`: the SLM and LLM lanes' device
time, the batch each ran vs the rows that took part, joins, the rest). ``--budget-s`` bounds the whole run (the
results are written after each method): a level that would not fit is recorded as skipped, as is a concurrency
above the rows the server could hold (it retries with half the rows when a ``--max-batch`` fails to start).

Writes ``serve_reasoning_<gpu>.json`` (``rows``: ``{"concurrency", "method", "requests_per_s",
"tokens_per_s", "p50_s", "p99_s", "ttft_p50_s", "engine_alone_tokens_per_s"}``; ``details``, ``skipped``),
``.md`` and ``.png`` (``serve_reasoning_<gpu>_split.*`` with ``--frontend-procs 1``, the server's engine in a
process of its own as ``rstitch serve --frontend-procs 1`` runs it); prints the table last. ``--replicas 1 2`` instead compares Ray Serve replicas
(:mod:`serve_replicas`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lab  # noqa: E402
import serve_clients as sc  # noqa: E402  (the closed-loop HTTP clients and the window's summary)
from serve_alone import engine_closed_loop  # noqa: E402  (the engine alone's closed loop and phase profile)

MATH = lab.MATH
METHODS = ("llm_only", "stitched")
LEVEL_OVERHEAD_S = 2.5  # a level beyond 2 x (warm-up + window), until measured: clients' start and records, drains
PROMPT_VOCAB = 200  # prompt token ids below this: valid for every pair here (the tiny one has 256)


# ---- requests ----------------------------------------------------------------------------------
def shapes(scale: float, n: int = 512, seed: int = 0) -> dict:
    """Prompt length and per-request ``max_tokens`` of each method (request ``i``: the same spread factor)."""
    import random

    rng = random.Random(seed)
    factors = [rng.uniform(0.5, 1.5) for _ in range(n)]
    stitched = (MATH["llm_tokens"] + MATH["slm_tokens"]) * scale
    return {"prompt": max(8, round(MATH["prompt"] * scale)),
            "llm_only": [max(1, round(MATH["llm_only_tokens"] * scale * f)) for f in factors],
            "stitched": [max(1, round(stitched * f)) for f in factors],
            "llm_share": MATH["llm_tokens"] / (MATH["llm_tokens"] + MATH["slm_tokens"])}


def alone_cfg(method: str, shape: dict, pair: str, device: str, dtype: str, engine: str, max_batch: int,
              **extra) -> dict:
    """The engine's part of a run's config (what :func:`build_engine`, :func:`warm` and
    :func:`serve_alone.engine_closed_loop` read) for ``method`` on ``shape``'s requests: decisions on the device,
    the fast engine's own configuration, a row long enough for the longest request; ``extra`` adds or overrides."""
    return {"method": method, "pair": pair, "device": device, "dtype": dtype, "engine": engine, "fast": {},
            "decisions": "device", "max_batch": max_batch,
            "max_length": shape["prompt"] + max(shape["llm_only"] + shape["stitched"]) + 8,
            "llm_share": shape["llm_share"], "prompt": shape["prompt"], "lengths": shape[method], **extra}


def prompts(n: int, length: int, vocab: int = PROMPT_VOCAB, seed: int = 1) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


# ---- the server process ------------------------------------------------------------------------
ROUTE_STEPS = 256  # a replayed route's length before it repeats (see replay_policy)


def replay_policy(slots: int, llm_share: float, device, width: int = ROUTE_STEPS):
    """One seeded route per row slot (LLM share, runs of ~4), replayed cyclically, decisions on ``device``.

    The routes follow the engine's step count, so with few rows a measurement window reads the stretch of route
    its steps fall on. Routes of 256 steps repeat often enough that any window of 1,100 steps or more reads MATH's
    LLM share within 0.7 points (0.304-0.316 for 0.309). Routes of 4,096 steps read 0.285-0.338: at 1 client a
    difference of 3 points between two windows is ~0.12 ms of a 2.6 ms stitched step on an H200 (an LLM call ~4 ms),
    as large as the server's gap to its engine alone that it was measured beside (estimated from the phase table,
    not measured apart)."""
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast.routes import route

    class CyclicReplay(ReplayPolicy):
        """A :class:`ReplayPolicy` whose routes repeat: the request engine's step index grows for ever."""

        def _llm_at(self, step, index):
            return super()._llm_at(step, index % self._llm.shape[1])

    routes = [route(width, round(llm_share * width), MATH["llm_run"], seed=100 + s) for s in range(slots)]
    return CyclicReplay(routes, device=device)


def build_pair(cfg: dict):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lab import random_pair

    if cfg["pair"] == "tiny":
        llm, slm = random_pair("tiny", "cpu", torch.float32)
    else:
        llm, slm = random_pair("qwen2", cfg["device"], getattr(torch, cfg["dtype"]))
    for m in (llm, slm):
        m.generation_config.eos_token_id = None
    return llm, slm


def build_engine(cfg: dict, llm, slm):
    if cfg["engine"] == "standin":  # no model: tokens at a set rate (the server's own ceiling)
        from serve_standin import StandinEngine, StandinTiming

        from hf_rstitch.core.scheduling import JoinPacing

        return StandinEngine(cfg["max_batch"], timing=StandinTiming(**cfg["standin"]),
                             pacing=JoinPacing(**cfg.get("join", {})))
    from hf_rstitch.batching.requests import RequestEngine

    policy = replay_policy(cfg["max_batch"], cfg["llm_share"], llm.device if cfg["decisions"] == "device" else None)
    return RequestEngine.of(llm, slm, max_batch=cfg["max_batch"], max_waiting=cfg["max_batch"], policy=policy,
                            engine=engine_spec(cfg["engine"], cfg.get("fast") or {}), max_length=cfg["max_length"],
                            prefill_chunk=cfg.get("prefill_chunk"), **cfg.get("join", {}))


def engine_spec(name: str, fields: dict):
    """``--engine`` as ``RequestEngine.of`` takes it: the name, or with ``--fast`` fields the FastConfig that the
    name runs (auto: :data:`hf_rstitch.fast.engine.AUTO`; fast: ``FastConfig()``) with those fields replaced."""
    if not fields or name == "default":
        return name
    import dataclasses

    from hf_rstitch.fast import FastConfig
    from hf_rstitch.fast.engine import AUTO

    return dataclasses.replace(AUTO if name == "auto" else FastConfig(), **fields)


def fast_fields(pairs: list[str]) -> dict:
    """``--fast KEY=VALUE ...`` as FastConfig fields (values: true / false / none, numbers, else strings)."""
    import dataclasses

    from hf_rstitch.fast.config import FastConfig

    names, fields = {f.name for f in dataclasses.fields(FastConfig)}, {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in names:
            raise SystemExit(f"--fast {pair!r}: expected KEY=VALUE with KEY a FastConfig field ({', '.join(sorted(names))})")
        word = raw.strip().lower()
        value = {"true": True, "false": False, "none": None}.get(word, raw)
        if value is raw:
            try:
                value = float(raw) if "." in raw else int(raw)
            except ValueError:
                pass
        fields[key] = value
    FastConfig(**fields)  # validated here, before any server starts
    return fields


def warm(engine, cfg: dict) -> float:
    """Every batch bucket's graphs captured (two waves of short requests at the full batch), joins included."""
    from hf_rstitch.batching.requests import Request

    t0 = time.perf_counter()
    role = "llm" if cfg["method"] == "llm_only" else None
    n = 2 * cfg["max_batch"]
    engine.run([Request(p, max_new_tokens=4 + i % 9, role=role)
                for i, p in enumerate(prompts(n, cfg["prompt"], seed=9))])
    return time.perf_counter() - t0


def serve_worker(cfg: dict) -> int:
    """Server mode: pair, engine, warm-up, the engine alone at each level (written to ``cfg['alone_out']``), then
    the app of ``rstitch serve`` on draining uvicorn until SIGTERM. With ``--frontend-procs 1`` the engine alone
    runs in a process of its own that exits before the server's engine process starts, so that each holds the GPU
    alone (two engines of the 7B pair at MATH's lengths do not fit one H200)."""
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.server import run

    if cfg.get("frontend_procs"):  # rstitch serve --frontend-procs 1: the engine in a process of its own
        from hf_rstitch.serve.frontends import EngineProcess

        if lab.in_own_process(alone_worker, cfg) != 0:
            raise RuntimeError("the engine alone's process failed (its traceback is above)")
        engine = EngineProcess(partial(split_build, cfg)).start(timeout_s=cfg.get("startup_s", 600))
        app = create_app(engine.client(), sc.IdTokenizer(), engine.settings)
    else:
        from hf_rstitch.serve.driver import freeze_gc

        engine, vocab, warm_s = built(cfg)
        engine_alone(engine, cfg, warm_s)
        app = create_app(engine, sc.IdTokenizer(), server_settings(cfg, vocab))
        freeze_gc()  # as rstitch serve's one process does before it serves (the split one's engine process does too)
    run(app, "127.0.0.1", cfg["port"], log_level="warning")
    return 0


def engine_alone(engine, cfg: dict, warm_s: float) -> dict:
    """The engine alone at each of ``cfg['alone_levels']``, written to ``cfg['alone_out']`` (and returned)."""
    alone = {"warm_up_s": warm_s, "levels": {}}
    ps = prompts(len(cfg["lengths"]), cfg["prompt"])
    for c in cfg["alone_levels"]:
        alone["levels"][c] = engine_closed_loop(engine, cfg, ps, c, cfg["warmup_s"], cfg["window_s"])
        print(f"[engine alone {cfg['method']} c={c}] {json.dumps(alone['levels'][c])}", file=sys.stderr, flush=True)
    Path(cfg["alone_out"]).write_text(json.dumps(alone))
    return alone


def alone_worker(cfg: dict) -> None:
    """The engine alone in a process of its own: pair, engine, warm-up, each level (:func:`engine_alone`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    engine, _, warm_s = built(cfg)
    engine_alone(engine, cfg, warm_s)


def server_settings(cfg: dict, vocab: int):
    from hf_rstitch.serve.app import ServerSettings

    return ServerSettings(model_name="random-pair", max_context=cfg["max_length"], vocab_size=vocab,
                          max_tokens=16, pin="llm" if cfg["method"] == "llm_only" else None,
                          **cfg.get("settings", {}))


def built(cfg: dict) -> tuple:
    """``(engine, vocab, warm-up seconds)``: the pair, its request engine, every batch bucket warmed up."""
    llm, slm = build_pair(cfg) if cfg["engine"] != "standin" else (None, None)
    vocab = min(llm.config.vocab_size, slm.config.vocab_size) if llm is not None else PROMPT_VOCAB
    engine = build_engine(cfg, llm, slm)
    return engine, vocab, warm(engine, cfg)


def split_build(cfg: dict):
    """The engine process's build with ``--frontend-procs 1``: the same pair, engine and warm-up as one process."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    engine, vocab, _ = built(cfg)
    return engine, server_settings(cfg, vocab)


def _free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def standin_timing(args) -> dict | None:
    """``--standin``: the stand-in's :class:`~serve_standin.StandinTiming` fields; None otherwise."""
    if not getattr(args, "standin", False):
        return None
    base, row, host = args.standin_ms or (6.0, 0.04, 2.0)
    join, join_row = getattr(args, "standin_join_ms", None) or (0.0, 0.0)
    return {"base_ms": base, "row_ms": row, "host_ms": host, "join_ms": join, "join_row_ms": join_row}


def join_pacing(args) -> dict:
    """``--join-wait`` / ``--join-group`` as the engine's ``join_wait`` / ``join_group`` (checked here; those left out:
    ``rstitch serve``'s defaults, :class:`~hf_rstitch.engine.EngineConfig`'s, written back into ``args``)."""
    from hf_rstitch.core.scheduling import JoinPacing
    from hf_rstitch.engine.config import EngineConfig

    served = EngineConfig()
    args.join_wait = served.join_wait if args.join_wait is None else args.join_wait
    args.join_group = served.join_group if args.join_group is None else args.join_group
    fields = {"join_wait": args.join_wait, "join_group": args.join_group}
    try:
        JoinPacing(**fields)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    return fields


# ---- the sweep ---------------------------------------------------------------------------------
def start_server(cfg: dict, out: Path, timeout_s: float) -> tuple[subprocess.Popen | None, str, bool]:
    """The server process for ``cfg``, or None with why (and its last log lines) and whether it merely ran out of
    ``timeout_s`` (a slow start, which fewer rows would not cure) rather than exiting."""
    log = out / f"server_{cfg['method']}_b{cfg['max_batch']}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-worker", json.dumps(cfg)],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        sc.wait_healthy(f"http://127.0.0.1:{cfg['port']}", proc, timeout_s)
        return proc, "", False
    except RuntimeError as err:
        slow = proc.poll() is None  # still starting when the time ran out
        stop(proc)
        tail = log.read_text().strip().splitlines()[-5:]
        why = f"{err} (still starting: raise --startup-s)" if slow else str(err)
        return None, f"{why}: " + " | ".join(tail), slow


def spy_on(pid: int, args, out: Path) -> subprocess.Popen | None:
    """``--spy``: py-spy over the server's processes for the level's window (closed_loop starts its clients 0.8 s
    from now, then warms up), only samples taken while a thread holds the GIL (spy.py)."""
    if not getattr(args, "spy", False):
        return None
    import spy

    return spy.start(pid, 0.8 + args.warmup_s, args.window_s, out)


def spied(recording: subprocess.Popen, out: Path) -> dict:
    import spy

    try:
        recording.wait(30)
    except subprocess.TimeoutExpired:
        recording.kill()
    return spy.summary(out)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_method(method: str, args, shape: dict, work: Path, budget) -> tuple[list, list, dict]:
    """One method's rows, skipped levels and details; tries ``args.max_batch``, then halves it on a start that exited,
    unless the same failure repeats (a start that ran out of --startup-s is not retried; the rows that worked stay in ``args.max_batch`` for the next method). Server
    logs and the engine-alone numbers go through ``work``, a scratch folder."""
    rows, skipped, details = [], [], {}
    overhead = getattr(args, "level_overhead_s", LEVEL_OVERHEAD_S)  # measured by the first method, if any
    per_level = 2 * (args.warmup_s + args.window_s) + overhead  # the engine alone, then the server
    levels = list(args.levels)
    max_batch, proc, why, last = max(levels) if args.max_batch is None else args.max_batch, None, "", None
    while proc is None and max_batch >= 1:
        fit = [c for c in levels if c <= max_batch]
        reserve = getattr(args, "reserve_s", args.startup_s)  # for this server's start
        fit = fit[:max(0, int((budget.left() - reserve) // per_level))]
        cfg = alone_cfg(method, shape, "tiny" if args.dry_run_cpu else "qwen2", args.device, args.dtype, args.engine,
                        max_batch, fast=fast_fields(args.fast), decisions=args.decisions, alone_levels=fit,
                        warmup_s=args.warmup_s, window_s=args.window_s, port=sc.free_port(),
                        alone_out=str(work / f"alone_{method}.json"), standin=standin_timing(args),
                        join=join_pacing(args), frontend_procs=getattr(args, "frontend_procs", 0),
                        startup_s=args.startup_s,
                        settings={k: v for k, v in (("stream_interval", args.stream_interval),
                                                    ("stream_writes_per_s", args.stream_writes_per_s)) if v is not None})
        t0, alone_s = time.monotonic(), len(fit) * (args.warmup_s + args.window_s)
        proc, err, slow = start_server(cfg, work, args.startup_s + alone_s + 2 * len(fit))
        if proc is not None:  # what the next method's start reserves: this one's load and warm-up, with a margin
            args.reserve_s = max(15.0, 1.15 * (time.monotonic() - t0 - alone_s) + 2)
        else:
            why = f"the server did not start with --max-batch {max_batch}: {err}"
            print(why, file=sys.stderr)
            if slow or err == last:  # a slow start, or the same failure with fewer rows: rows are not the cause
                break
            last, max_batch = err, max_batch // 2
    if proc is None:
        why = why or f"no server started (--max-batch {args.max_batch})"
        return rows, [{"concurrency": c, "method": method, "reason": why} for c in levels], details
    args.max_batch = max_batch
    try:
        alone = json.loads(Path(cfg["alone_out"]).read_text())
        url = f"http://127.0.0.1:{cfg['port']}"
        bodies = [{"prompt": p, "max_tokens": n, "temperature": 0}
                  for p, n in zip(prompts(len(shape[method]), shape["prompt"]), shape[method])]
        for c in levels:
            if c > max_batch:
                skipped.append({"concurrency": c, "method": method, "reason": why or f"above --max-batch {max_batch}"})
                continue
            if c not in fit or budget.left() < args.warmup_s + args.window_s + overhead:
                skipped.append({"concurrency": c, "method": method,
                                "reason": f"time budget: {budget.left():.0f} s left of --budget-s {args.budget_s}"})
                continue
            t_level = time.monotonic()
            recording = spy_on(proc.pid, args, work / f"spy_{method}_c{c}.txt")
            s = sc.closed_loop(url, bodies, c, args.warmup_s, args.window_s, args.client_procs)
            e = alone["levels"][str(c)]
            details[f"{method}@{c}"] = {"server": s, "engine_alone": e, "max_batch": max_batch}
            if recording is not None:
                details[f"{method}@{c}"]["spy"] = spied(recording, work / f"spy_{method}_c{c}.txt")
            if s["errors"] or e["errors"]:  # requests the server or engine failed: said, and no row if none completed
                skipped.append({"concurrency": c, "method": method, "reason": (
                    f"{s['errors']} requests failed through the server (statuses {s['statuses']}), {e['errors']} in "
                    f"the engine alone: {s['first_error'] or e['first_error']}")})
            if s["completed"]:
                rows.append({"concurrency": c, "method": method, "requests_per_s": s["requests_per_s"],
                             "tokens_per_s": s["tokens_per_s"], "p50_s": s["p50_s"], "p99_s": s["p99_s"],
                             "ttft_p50_s": s["ttft_p50_s"], "engine_alone_tokens_per_s": e["tokens_per_s"]})
            print(f"[{method} c={c}] {json.dumps(details[f'{method}@{c}'])}", file=sys.stderr, flush=True)
            sc.wait_idle(url, 60)
            details[f"{method}@{c}"]["server_level_s"] = time.monotonic() - t_level
        details[f"{method}@warm_up_s"] = alone["warm_up_s"]
        spent = [d["server_level_s"] for d in details.values() if isinstance(d, dict) and "server_level_s" in d]
        if spent:  # a server level's time beyond warm-up and window, and a margin for the engine alone's drain
            args.level_overhead_s = max(0.5, sum(spent) / len(spent) - args.warmup_s - args.window_s) + 0.5
    finally:
        stop(proc)
    return rows, skipped, details


# ---- results -----------------------------------------------------------------------------------
def markdown(doc: dict) -> str:
    a = doc["args"]
    head = [f"# Serving reasoning traffic: LLM alone vs stitched, same server, {doc['gpu']}", "",
            f"{doc['pair']}; MATH-shaped requests scaled by {a['scale']} (LLM alone {doc['mean_tokens']['llm_only']:.0f} "
            f"tokens a request, stitched {doc['mean_tokens']['stitched']:.0f} at LLM share "
            f"{doc['llm_share']:.2f}, runs of ~4, prompts of {doc['prompt_tokens']}); closed loop, "
            f"{a['warmup_s']} s warm-up then a {a['window_s']} s window per level; decisions on the {a['decisions']}; "
            + (f"join pacing: --join-wait {a['join_wait']} --join-group {a['join_group']}." if a.get("join_wait")
               else "joins at once.")
            + " A server's ms a step is the window over its engine's steps; its busy part is the engine thread's "
              "time stepping and handing events on (/health `busy_s`), the rest of the window (server idle) it "
              "waited for requests: a round trip between a request's end and the next one's arrival. LLM calls a step: the "
              "share of the window's steps the LLM ran in (/health `llm_calls`); the replayed routes follow the "
              "engine's step count, so two windows of few rows may read different route stretches.",
            "", "| concurrency | method | requests/s | tokens/s | engine alone tokens/s | server / engine | "
            "p50 (s) | p99 (s) | TTFT p50 (s) | stitched / LLM alone requests/s | completed in window (server / engine) | "
            "ms a step (server / busy part / engine) | server idle | LLM calls a step (server / engine) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["concurrency"], r["method"]): r for r in doc["rows"]}
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in doc["rows"]:
        base = by.get((r["concurrency"], "llm_only"))
        gain = (r["requests_per_s"] / base["requests_per_s"] if r["method"] == "stitched" and base
                and base["requests_per_s"] else None)
        ratio = r["tokens_per_s"] / r["engine_alone_tokens_per_s"] if r["engine_alone_tokens_per_s"] else None
        d = doc["details"].get(f"{r['method']}@{r['concurrency']}", {})
        done = f"{d.get('server', {}).get('completed', '-')} / {d.get('engine_alone', {}).get('completed', '-')}"
        server = d.get("server", {})
        ms = [1e3 / x if x else None for x in (server.get("steps_per_s"), d.get("engine_alone", {}).get("steps_per_s"))]
        idle = None if server.get("busy_share") is None else f"{max(0.0, 1 - server['busy_share']):.0%}"
        head.append(f"| {r['concurrency']} | {r['method']} | {f(r['requests_per_s'])} | {f(r['tokens_per_s'], 0)} | "
                    f"{f(r['engine_alone_tokens_per_s'], 0)} | {f(ratio)} | {f(r['p50_s'])} | {f(r['p99_s'])} | "
                    f"{f(r['ttft_p50_s'])} | {f(gain)}x | {done} | {f(ms[0])} / {f(server.get('busy_ms_a_step'))} / "
                    f"{f(ms[1])} | {idle or '-'} | {f(server.get('llm_calls_a_step'))} / "
                    f"{f(d.get('engine_alone', {}).get('llm_calls_a_step'))} |".replace("| -x |", "| - |"))
    for s in doc["skipped"]:
        head.append(f"\nSkipped: {s['method']} at concurrency {s['concurrency']}: {s['reason']}")
    spied = [(k, d["spy"]) for k, d in doc["details"].items() if isinstance(d, dict) and d.get("spy")]
    if spied:
        import spy

        head += ["", "Who held the GIL in the server's processes during each window (py-spy --gil, "
                 f"{spy.RATE} samples a second while a thread holds it; the spawned child is the split layout's "
                 "engine process, its rstitch-engine thread the one that steps the engine):", ""]
        head += [f"- {k}: " + "; ".join(spy.lines(s)) for k, s in spied]
    if doc.get("phases"):
        from serve_alone import table

        head += ["", "The request engine alone, where a step's time goes (the second half of each level's warm-up; "
                 "device ms a step between CUDA events around each lane call; batch: rows the lane's graph ran, "
                 "rows: rows that took part, columns: columns read a call; other: host work the device did not "
                 "overlap, and idle; steps run ahead: steps whose next call was queued before their values were read, "
                 "so that the host's work for them overlapped the device -- none where a waiting request could join "
                 "at the next step; after the read: steps whose next call was queued right after their values were "
                 "read, before the host's work for them):", "", *table(doc["phases"])]
    if doc.get("sources"):
        head += ["", "Merged from runs made in separate device calls (`.wheels` carried: the script's header lists "
                 "them), then merged here by the last line's command:", "",
                 *(f"- {device_call(src)} ({src['date']})" for src in doc["sources"])]
    elif doc.get("command") and not a.get("dry_run_cpu"):
        head += ["", f"Regenerate (one device call, `.wheels` carried: the script's header lists them): "
                 f"{device_call(doc)}; results under `$OUT`."]
    return "\n".join(head) + "\n"


def device_call(doc: dict) -> str:
    """The one device call that regenerates ``doc`` (a run's results), quoted for markdown."""
    a = doc["args"]
    argv = doc["command"].split("serve_reasoning.py", 1)[-1].replace(f"--out-dir {a['out_dir']}", "").split()
    if "--frontend-procs" not in argv:  # the layout named: the default changed once (docs/serving.md)
        argv += ["--frontend-procs", str(a.get("frontend_procs") or 0)]
    return f"`bash benchmarks/gpu_i48.sh serve {' '.join(argv)}`"


SAME_QUESTION = ("scale", "warmup_s", "window_s", "decisions", "join_wait", "join_group", "frontend_procs", "engine",
                 "dtype", "fast")


def merge(paths: list[str], out: Path, tag: str) -> str:
    """One results file (rows, phases, plot) from runs of one question made in separate device calls -- a method a
    call where both do not fit one (``gpu_i48.sh math``). A row measured by a later file replaces an earlier one's
    and its skip; runs that differ in GPU, pair or settings are refused, naming the field."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    for path, d in zip(paths[1:], docs[1:]):
        for key, mine, first in [(k, d[k], docs[0][k]) for k in ("gpu", "pair", "prompt_tokens")] + [
                (f"args.{k}", d["args"].get(k), docs[0]["args"].get(k)) for k in SAME_QUESTION]:
            if mine != first:
                sys.exit(f"--merge: {path} has {key} = {mine!r} but {paths[0]} has {first!r}: "
                         "not runs of one question, so not one table")
    rows = {(r["concurrency"], r["method"]): r for d in docs for r in d["rows"]}
    skipped = [s for d in docs for s in d["skipped"] if (s["concurrency"], s["method"]) not in rows]
    doc = {**docs[0], "command": lab.command(), "rows": sorted(rows.values(), key=lambda r: (r["concurrency"],
                                                                                           r["method"])),
           "skipped": skipped, "details": {k: v for d in docs for k, v in d["details"].items()},
           "phases": dict(sorted({k: v for d in docs for k, v in d["phases"].items()}.items(),
                                 key=lambda kv: (kv[0].split("@")[0], int(kv[0].split("@")[1])))),
           "sources": [{k: d[k] for k in ("command", "date", "args")} for d in docs]}
    doc["args"] = {**docs[0]["args"], "methods": sorted({m for d in docs for m in d["args"]["methods"]}), "tag": tag}
    return write(doc, out)


def write(doc: dict, out: Path) -> str:
    """``serve_reasoning_<gpu>[_split]<tag>.{json,md,png}`` of ``doc`` under ``out`` (``_split``: the server's
    engine in a process of its own, as ``rstitch serve --frontend-procs 1`` runs it); returns the markdown."""
    split = "_split" if doc["args"].get("frontend_procs") else ""
    stem = out / f"serve_reasoning_{doc['gpu'].lower().replace(' ', '_')}{split}{doc['args']['tag']}"
    text = markdown(doc)
    lab.write_result(stem, doc, text)
    if doc["rows"]:
        plot(doc, stem.with_suffix(".png"))
    return text


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for method, style, color in (("llm_only", "o-", "C0"), ("stitched", "s-", "C1")):
        rows = sorted((r for r in doc["rows"] if r["method"] == method), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rows]
        ax1.plot(xs, [r["requests_per_s"] for r in rows], style, color=color, label=f"{method} (server)")
        ax2.plot(xs, [r["tokens_per_s"] for r in rows], style, color=color, label=f"{method} (server)")
        ax2.plot(xs, [r["engine_alone_tokens_per_s"] for r in rows], style[0], color=color, alpha=0.35,
                 linestyle="--", label=f"{method} (engine alone)")
    for ax, label in ((ax1, "completed requests / s"), (ax2, "tokens / s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (closed loop)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"rstitch serve, reasoning-shaped requests (x{doc['args']['scale']}): {doc['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-worker"]:
        return serve_worker(json.loads(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--scale", type=float, default=0.05, help="factor on every token count, both methods alike")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256], help="concurrencies")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--warmup-s", type=float, default=4.0, help="per level, excluded from the window")
    ap.add_argument("--window-s", type=float, default=8.0, help="per level, the measurement window")
    ap.add_argument("--budget-s", type=float, default=400.0, help="the whole run; levels that would not fit are skipped")
    ap.add_argument("--startup-s", type=float, default=None,
                    help="a server's start (load, warm-up) at most; the budget reserves it for the first server, "
                         "1.15x the first's actual start for the next (default: 200 on CUDA, where a 7B pair loads, "
                         "captures its graphs and measures the engine alone first; 60 on CPU)")
    ap.add_argument("--max-batch", type=int, default=None, help="server rows (default: the largest level)")
    ap.add_argument("--spy", action="store_true",
                    help="record each server level's window with py-spy (pip install py-spy): which threads of the "
                         "server's processes hold the GIL, and in what (spy.py; a table in the report)")
    ap.add_argument("--client-procs", type=int, default=0, help="client processes (0: one per 16 clients, <= 8)")
    ap.add_argument("--engine", default="auto", choices=["auto", "fast", "default"],
                    help="the server's --engine (default: rstitch serve's, auto: AUTO's FastConfig on a proven pair)")
    ap.add_argument("--fast", nargs="+", default=[], metavar="KEY=VALUE",
                    help="FastConfig fields replaced in the engine's config, e.g. compact_rows=true")
    ap.add_argument("--join-wait", type=int, default=None, metavar="K",
                    help="the engine's join pacing (rstitch serve --join-wait): free rows stay empty up to K steps so "
                         "that waiting requests join in groups, one join call a group (first tokens up to K steps "
                         "later); 0: join at once; default: rstitch serve's")
    ap.add_argument("--join-group", type=int, default=None, metavar="M",
                    help="with --join-wait: M joiners join at once (default: rstitch serve's --join-group)")
    ap.add_argument("--tag", default="", help="a suffix of the results' file names")
    ap.add_argument("--decisions", default="device", choices=["device", "host"],
                    help="where the replayed routes' decisions come back (device: as an entropy policy's)")
    ap.add_argument("--frontend-procs", type=int, default=None, choices=[0, 1],
                    help="the server's --frontend-procs: 1 runs its engine in a process of its own (rstitch serve's "
                         "split; the engine alone is measured before it starts, in a process of its own too); "
                         "default: rstitch serve's (1 on a CUDA --device, else 0)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--replicas", type=int, nargs="+", default=None,
                    help="instead: compare Ray Serve replica counts (serve_replicas.py), e.g. --replicas 1 2")
    ap.add_argument("--replica-concurrency", type=int, default=128, help="--replicas: clients of the closed loop")
    ap.add_argument("--replace-timeout-s", type=float, default=150.0,
                    help="--replicas: how long the kill test waits for Ray's replacement replica")
    ap.add_argument("--no-kill", action="store_true", help="--replicas: skip the kill test")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny pair on CPU, tiny counts: checks the whole path")
    ap.add_argument("--stream-interval", type=float, default=None,
                    help="the server's --stream-interval (default: rstitch serve's; 0: a write per step)")
    ap.add_argument("--stream-writes-per-s", type=float, default=None,
                    help="the server's --stream-writes-per-s (default: rstitch serve's; 0: no limit)")
    ap.add_argument("--standin", action="store_true",
                    help="no model: a stand-in engine writes tokens at a set rate (serve_standin.py), on CPU; measures "
                         "the server's own ceiling against the same engine alone")
    ap.add_argument("--standin-ms", type=float, nargs=3, default=None, metavar=("BASE", "ROW", "HOST"),
                    help="--standin: a step takes BASE + ROW x rows ms, HOST ms of it Python holding the GIL "
                         "(default 6 0.04 2: 256 rows at 16k tokens/s)")
    ap.add_argument("--standin-join-ms", type=float, nargs=2, default=None, metavar=("JOIN", "JOIN_ROW"),
                    help="--standin: a step that admits requests takes JOIN + JOIN_ROW x joiners ms more (their join "
                         "call; default 0 0)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="instead: write one results file under --out-dir (named with --tag) from the JSON files of "
                         "runs made in separate device calls, e.g. gpu_i48.sh math's one method a call")
    args = ap.parse_args(argv)
    if args.merge:
        print(merge(args.merge, Path(args.out_dir), args.tag))
        return 0
    if args.dry_run_cpu:
        args.device, args.dtype, args.engine = "cpu", "float32", "default"
        args.scale = min(args.scale, 0.01)
        args.levels = [c for c in args.levels if c <= 4]
        args.levels = args.levels if len(args.levels) > 1 else [1, 4]
        args.warmup_s, args.window_s = min(args.warmup_s, 1.0), min(args.window_s, 2.0)
        args.replica_concurrency = min(args.replica_concurrency, 4)
        args.max_batch = args.max_batch or (2 if args.replicas else None)
    if args.standin:
        args.device, args.dtype, args.engine = "cpu", "float32", "standin"
    if args.spy:
        import spy

        if not spy.available():
            sys.exit("--spy needs py-spy on the PATH: pip install py-spy (benchmarks/gpu_i48.sh installs it from "
                     ".wheels)")
    if args.startup_s is None:
        args.startup_s = 200.0 if args.device.startswith("cuda") else 60.0
    if args.frontend_procs is None:  # rstitch serve's default layout (ServeConfig.__post_init__)
        args.frontend_procs = 1 if args.device.startswith("cuda") and not args.replicas else 0
    if args.replicas:
        import serve_replicas

        return serve_replicas.main(args)
    budget, out = lab.Budget(args.budget_s), Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="serve_reasoning_"))  # server logs: only the results go to --out-dir
    shape = shapes(args.scale)
    fast_fields(args.fast)  # a bad --fast fails now, not in a server process
    join_pacing(args)  # and a bad --join-wait / --join-group
    if shape["prompt"] + max(shape["llm_only"]) + 8 > 4096 and args.engine != "default":
        sys.exit(f"--scale {args.scale}: prompt + max_tokens reach {shape['prompt'] + max(shape['llm_only'])} tokens, "
                 "beyond the fast engine's 4096 a row; lower --scale")
    rows, skipped, details = [], [], {}
    for method in args.methods:  # the results are written after each method: a run cut short keeps what it did
        r, s, d = run_method(method, args, shape, work, budget)
        rows, skipped, details = rows + r, skipped + s, {**details, **d}
        text = report(args, shape, rows, skipped, details, out)
    print(text)
    return 0


def report(args, shape: dict, rows: list, skipped: list, details: dict, out: Path) -> str:
    """The run's results document, written under ``out`` (:func:`write`); returns the markdown."""
    import torch

    from lab import environment

    gpu = "cpu_standin" if args.standin else "cpu" if args.dry_run_cpu else torch.cuda.get_device_name()
    pair = ("a stand-in engine, no model (serve_standin.py: step ms = {} + {} x rows, {} of it host Python; a step "
            "that admits requests {} + {} x joiners ms more)".format(*standin_timing(args).values()) if args.standin else "tiny random Qwen2 pair (CPU dry run)" if args.dry_run_cpu
        else f"random Qwen2 7B / 1.5B, {args.dtype}")
    doc = {**environment(), "gpu": gpu, "args": vars(args), "pair": pair,
           "prompt_tokens": shape["prompt"], "llm_share": shape["llm_share"],
           "mean_tokens": {m: sum(shape[m]) / len(shape[m]) for m in METHODS},
           "rows": sorted(rows, key=lambda r: (r["concurrency"], r["method"])), "skipped": skipped, "details": details,
           "phases": {k: d["engine_alone"]["phases"] for k, d in details.items()
                      if isinstance(d, dict) and d.get("engine_alone", {}).get("phases")}}
    return write(doc, out)


if __name__ == "__main__":
    sys.exit(main())
