"""Replicas of the stitched server on Ray Serve, one a GPU: N replicas against one on the same load, and a
replica killed under load (issue #38). Run through ``serve_reasoning.py --replicas``:

    bash benchmarks/serve_replicas_gpu.sh            # two GPUs, one call: installs the carried Ray bundle, then
    PYTHONPATH=. python benchmarks/serve_reasoning.py --replicas 1 2 --out-dir $OUT --scale 0.05 \
        --max-batch 64 --replica-concurrency 128 --warmup-s 4 --window-s 12 --stream-writes-per-s 500 \
        --replace-timeout-s 100
    PYTHONPATH=. python benchmarks/serve_reasoning.py --replicas 1 2 --dry-run-cpu --out-dir /tmp/sr  # CPU check

Each replica builds the random-weight pair with replayed routes of ``serve_reasoning.py`` (:class:`Builder`, run
inside the replica), warms its batch buckets up and serves the app of ``rstitch serve`` behind
:mod:`hf_rstitch.serve.replicas` (Ray's proxy, front replicas, engine replicas with ``num_gpus=1`` each). For
each replica count: a closed loop of ``--replica-concurrency`` streaming clients (``--warmup-s`` excluded, then
``--window-s``), requests/s counted as completed inside the window, with the requests each replica completed (how
Ray spread them) and the CPU cores each of Ray Serve's processes used in the window (proxy, front replicas,
engine replicas: a process near one core is what a replica count that does not scale waits on). Then, at the
largest count, the kill test: the same load runs while one engine replica's process is killed (SIGKILL,
``--warmup-s`` into the load); every request must either complete or end with the clean error of a lost replica
(a 503 OpenAI error, or an error event and ``[DONE]`` in its stream) -- or a 429 if the survivor's rows and queue
are full -- and Ray must start a replacement (``/health`` shows a new pid).

Writes ``serve_replicas_<gpu>.json`` (``rows``: per replica count; ``kill``) and ``.md`` after each stage.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_clients as sc  # noqa: E402
import serve_reasoning as sr  # noqa: E402


class Builder:
    """A replica's app (picklable; runs inside the replica): the random pair, replayed routes, warm buckets."""

    def __init__(self, bench: dict):
        self.bench = bench

    def __call__(self, cfg):
        from hf_rstitch.serve.app import ServerSettings, create_app

        llm, slm = sr.build_pair(self.bench) if self.bench["engine"] != "standin" else (None, None)
        vocab = min(llm.config.vocab_size, slm.config.vocab_size) if llm is not None else sr.PROMPT_VOCAB
        engine = sr.build_engine(self.bench, llm, slm)
        sr.warm(engine, self.bench)
        settings = ServerSettings(http=dataclasses.replace(cfg.http, max_tokens=16), model_name="random-pair",
                                  max_context=self.bench["max_length"], vocab_size=vocab,
                                  pin="llm" if self.bench["method"] == "llm_only" else None)
        return create_app(engine, sc.IdTokenizer(), settings)


def replica_health(url: str, tries: int = 32) -> dict[int, dict]:
    """``/health`` of each engine replica that answers, by pid (asked 8 at a time: Ray spreads concurrent requests)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def health(_):
        try:
            return httpx.get(url + "/health", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None

    with ThreadPoolExecutor(8) as pool:
        return {h["pid"]: h for h in pool.map(health, range(tries)) if h and "pid" in h}


def replica_pids(url: str, tries: int = 32) -> set[int]:
    return set(replica_health(url, tries))


ROLES = (("proxy", "ProxyActor"), ("front", "RStitchFront"), ("engine", "RStitchReplica"))


def serve_processes() -> dict[int, str]:
    """Ray Serve's processes on this machine by role (``proxy``, ``front``, ``engine``), from their titles."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        found.update({proc.pid: role for role, key in ROLES if key in title})
    return found


def cpu_seconds(pids) -> dict[int, float]:
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def measured_window(url: str, bodies: list[dict], args) -> dict:
    """The closed loop's summary, plus the CPU cores each role of Ray Serve's processes used in the window (a
    role near 1.0 a process is what a replica count that does not scale waits on) and each replica's share."""
    roles, cpu = serve_processes(), {}

    def sample():
        time.sleep(args.warmup_s)
        cpu["t0"], cpu["a"] = time.monotonic(), cpu_seconds(roles)
        time.sleep(args.window_s)
        cpu["t1"], cpu["b"] = time.monotonic(), cpu_seconds(roles)

    before = {pid: h.get("completed", 0) for pid, h in replica_health(url).items()}
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    s = sc.closed_loop(url, bodies, args.replica_concurrency, args.warmup_s, args.window_s, args.client_procs)
    sampler.join()
    cores: dict[str, list[float]] = {}
    for pid, role in roles.items():
        if pid in cpu.get("a", {}) and pid in cpu.get("b", {}):
            cores.setdefault(role, []).append((cpu["b"][pid] - cpu["a"][pid]) / (cpu["t1"] - cpu["t0"]))
    after = {pid: h.get("completed", 0) for pid, h in replica_health(url).items()}
    return {**s, "cpu_cores_by_role": {r: [round(c, 2) for c in v] for r, v in sorted(cores.items())},
            "completed_by_replica": {str(pid): n - before.get(pid, 0) for pid, n in sorted(after.items())}}


def kill_test(url: str, bodies: list[dict], args, n: int, seen: set[int]) -> dict:
    """Load at ``--replica-concurrency``; one engine replica killed ``--warmup-s`` in; how every request ended,
    and how long until Ray's replacement answers /health."""
    before = replica_pids(url)
    seen = set(seen)  # pids seen before (all replicas, if one sample missed some)
    out: dict = {}
    load = threading.Thread(target=lambda: out.update(zip(("records", "t0"), sc.run_clients(
        url, bodies, args.replica_concurrency, args.warmup_s + args.window_s, args.client_procs))))
    load.start()
    time.sleep(0.3 + args.warmup_s + 0.05 * max(1, min(8, args.replica_concurrency // 16)))  # run_clients: its start
    victim = min(before)
    held = replica_health(url, 16).get(victim, {}).get("in_flight")  # what the victim holds (read just before)
    t_kill = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    load.join()
    replaced, deadline = None, time.monotonic() + args.replace_timeout_s
    while replaced is None and time.monotonic() < deadline:
        now = replica_pids(url, 16)
        if now - before - seen and victim not in now:
            replaced = time.monotonic() - t_kill
        time.sleep(1.0)
    return {"replicas": n, "victim_pid": victim, "pids_before": sorted(before | seen),
            "victim_in_flight_at_kill": held, **ended(out["records"], t_kill),
            "replaced_after_s": replaced, "pids_after": sorted(replica_pids(url))}


OUTCOMES = ("complete", "replica_lost", "at_capacity", "still_streaming", "unclean")


def outcome(rec: dict) -> str:
    """How one request of the kill test ended: ``complete``; ``replica_lost`` (the clean error of a lost replica: a
    503, or an error event and ``[DONE]`` in its stream); ``at_capacity`` (a 429: the survivor full, retry later);
    ``still_streaming`` (``end`` None: cancelled when the load's clients stopped -- the benchmark's doing, not an
    error); else ``unclean``."""
    from hf_rstitch.serve.relay import LOST

    if rec["complete"]:
        return "complete"
    if rec.get("end") is None:
        return "still_streaming"
    if LOST in str(rec.get("error")):
        return "replica_lost"
    return "at_capacity" if rec["status"] == 429 else "unclean"


def ended(records: list[dict], t_kill: float) -> dict:
    """The kill test's requests by :func:`outcome`, overall and for those in flight at ``t_kill`` (on either
    replica) or sent a second after it; ``clean`` is the verdict: no request ended ``unclean``."""
    def count(recs):
        kinds = [outcome(r) for r in recs]
        return {k: kinds.count(k) for k in OUTCOMES}

    held = [r for r in records if r["start"] <= t_kill and (r.get("end") is None or r["end"] > t_kill)]
    after = [r for r in records if r["start"] > t_kill + 1.0]  # sent once the victim was known dead or soon after
    bad = [r for r in records if outcome(r) == "unclean"]
    return {"requests": len(records), **count(records), "in_flight_at_kill": count(held), "sent_after_kill": count(after),
            "lost_statuses": sorted({r["status"] for r in records if outcome(r) == "replica_lost"}),
            "unclean_examples": [f"status {r['status']}: {str(r.get('error'))[:200]}" for r in bad[:3]],
            "clean": not bad}


def main(args) -> int:
    import torch

    from hf_rstitch.serve import replicas
    from hf_rstitch.serve.config import ServeConfig
    from lab import environment

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = sr.shapes(args.scale)
    method = args.methods[0] if len(args.methods) == 1 else "stitched"
    max_batch = args.max_batch or 64
    bench = {"method": method, "pair": "tiny" if args.dry_run_cpu else "qwen2", "device": args.device,
             "dtype": args.dtype, "engine": args.engine, "decisions": args.decisions, "max_batch": max_batch,
             "max_length": shape["prompt"] + max(shape["llm_only"] + shape["stitched"]) + 8,
             "llm_share": shape["llm_share"], "prompt": shape["prompt"], "lengths": shape[method],
             "standin": sr.standin_timing(args)}
    bodies = [{"prompt": p, "max_tokens": n, "temperature": 0}
              for p, n in zip(sr.prompts(len(shape[method]), shape["prompt"]), shape[method])]
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # the replicas import this lab
    # requests and answers are small objects: a small object store starts fast wherever /dev/shm is small
    ray_init = {"log_to_driver": False, "runtime_env": {"env_vars": env}, "object_store_memory": 2 * 1024**3}
    cpu = args.dry_run_cpu or args.engine == "standin"
    if cpu:
        ray_init.update(num_cpus=2, object_store_memory=100 * 1024**2)
    rows = []
    gpu = ("cpu_standin" if args.engine == "standin" else "cpu") if cpu else torch.cuda.get_device_name()
    doc = {**environment(), "gpu": gpu, "gpus": 0 if cpu else torch.cuda.device_count(),
           "args": vars(args), "method": method, "max_batch": max_batch, "rows": rows, "kill": None,
           "pair": ("the stand-in engine (no model)" if args.engine == "standin"
                    else "tiny random Qwen2 pair (CPU dry run)" if args.dry_run_cpu
                    else f"random Qwen2 7B / 1.5B, {args.dtype}")}
    stem = out / f"serve_replicas_{gpu.lower().replace(' ', '_')}"
    for n in args.replicas:
        port = sc.free_port()
        url = f"http://127.0.0.1:{port}"
        cfg = ServeConfig(port=port, replicas=n, device=args.device, dtype=args.dtype, max_batch=max_batch,
                          max_queue=max_batch, drain_timeout=5.0, cpus_per_replica=0.5 if cpu else 1.0,
                          **{k: v for k, v in (("stream_interval", args.stream_interval),
                                               ("stream_writes_per_s", args.stream_writes_per_s)) if v is not None})
        t0 = time.monotonic()
        try:
            replicas.start(cfg, ray_init, build=Builder(bench))
            started = time.monotonic() - t0
            s = measured_window(url, bodies, args)
            rows.append({"replicas": n, "concurrency": args.replica_concurrency, "startup_s": started,
                         "pids": sorted(replica_pids(url)), **s})
            print(f"[{n} replicas] {rows[-1]}", file=sys.stderr, flush=True)
            report(doc, stem)  # what is measured so far survives a later stage's failure or time-out
            if n == max(args.replicas) and n >= 2 and not args.no_kill:
                kill = doc["kill"] = kill_test(url, bodies, args, n, set(rows[-1]["pids"]))
                print(f"[kill] {kill}", file=sys.stderr, flush=True)
        finally:
            replicas.stop()
    print(report(doc, stem))
    return 0


def report(doc: dict, stem: Path) -> str:
    """Write ``stem.json`` / ``.md`` from ``doc`` (speed-ups against one replica filled in); returns the table."""
    from lab import write_result

    one = next((r for r in doc["rows"] if r["replicas"] == 1), None)
    for r in doc["rows"]:
        r["speedup_vs_one"] = r["requests_per_s"] / one["requests_per_s"] if one and one["requests_per_s"] else None
    md = markdown(doc)
    write_result(stem, doc, md)
    return md


def markdown(doc: dict) -> str:
    a = doc["args"]
    lines = [f"# Ray Serve replicas, one a GPU: {doc['method']} server, {doc['gpu']} x {doc['gpus']}", "",
             f"{doc['pair']} with replayed routes (requests x{a['scale']}), --max-batch {doc['max_batch']} "
             f"a replica, closed loop of {a['replica_concurrency']} streaming clients, {a['warmup_s']} s warm-up then "
             f"a {a['window_s']} s window; {a.get('stream_writes_per_s') or 1000:g} stream writes a second in all "
             "(each replica its share).", "",
             "| replicas | requests/s | x one replica | tokens/s | p50 (s) | p99 (s) | TTFT p50 (s) | start (s) "
             "| completed by replica (warm-up + window) | CPU cores in the window: proxy / front / engine "
             "| CPU ms a request: proxy / front / engine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in doc["rows"]:
        lines.append(f"| {r['replicas']} | {f(r['requests_per_s'])} | {f(r['speedup_vs_one'])} | "
                     f"{f(r['tokens_per_s'], 0)} | {f(r['p50_s'])} | {f(r['p99_s'])} | {f(r['ttft_p50_s'])} | "
                     f"{f(r['startup_s'], 0)} | {' / '.join(map(str, r['completed_by_replica'].values()))} | "
                     f"{' / '.join(str(r['cpu_cores_by_role'].get(k, '-')) for k in ('proxy', 'front', 'engine'))} | "
                     f"{' / '.join(cpu_ms(r, k) for k in ('proxy', 'front', 'engine'))} |")
    if doc["kill"]:
        lines += ["", kill_verdict(doc["kill"])]
    return "\n".join(lines) + "\n"


def cpu_ms(row: dict, role: str) -> str:
    """CPU milliseconds a completed request cost ``role``'s processes together in the window."""
    cores = row["cpu_cores_by_role"].get(role)
    return "-" if not cores or not row["requests_per_s"] else f"{1e3 * sum(cores) / row['requests_per_s']:.0f}"


def kill_verdict(k: dict) -> str:
    """The kill test in words: how every request ended, and whether each one that did not complete ended cleanly."""
    held, after = k["in_flight_at_kill"], k["sent_after_kill"]
    verdict = ("CLEAN: every request that did not complete ended with the lost-replica error or a 429"
               if k["clean"] else f"NOT CLEAN: {k['unclean']} requests ended otherwise, e.g. {k['unclean_examples']}")
    return (f"Kill test ({k['replicas']} replicas, pid {k['victim_pid']} killed under load, holding "
            f"{k['victim_in_flight_at_kill']} requests by its /health just before): {k['requests']} requests, "
            f"{k['complete']} complete, {k['replica_lost']} with the lost-replica error (statuses {k['lost_statuses']}), "
            f"{k['at_capacity']} with a 429 (the survivor full), {k['still_streaming']} still streaming when the load "
            f"ended (cancelled by the benchmark, not errors), {k['unclean']} otherwise. Of the {sum(held.values())} in "
            f"flight at the kill: {held['complete']} complete, {held['replica_lost']} lost-replica error, "
            f"{held['still_streaming']} still streaming at the end; {after['complete']} / {sum(after.values())} sent "
            f"after the kill completed; replacement answering after "
            f"{'-' if k['replaced_after_s'] is None else round(k['replaced_after_s'])} s. {verdict}.")
