"""Load test of ``rstitch serve`` on loopback (issue #22): N concurrent clients, M requests.

Starts a server on 127.0.0.1 in a subprocess (the shipped pair through ``rstitch serve``, or the
random-weight Qwen2 7B / 1.5B pair on a GPU through this script's own server mode), then N
asyncio clients send M streaming chat (shipped pair) or token-id completion (random pair) requests
between them. Bounded: M requests, a per-request timeout and a wall-clock limit for the whole run.
Checks that nothing was lost (M answers, all 200) and every response is complete (a finish
reason, the ``[DONE]`` line, ``usage.completion_tokens`` equal to the tokens streamed);
optionally that the first K greedy answers equal solo ``generate`` on the same pair. Records p50 /
p99 latency and time to first token, requests/s and completion tokens/s; writes
``benchmarks/results/serve_load_<name>.json`` + ``.md`` and prints one JSON line last.

    python benchmarks/serve_load.py --clients 8 --requests 64 --check-solo 64          # shipped pair, CPU
    python benchmarks/serve_load.py --pair random-qwen2 --device cuda --clients 32 --requests 256 \\
        --max-batch 32 --max-tokens 256                                                # one GPU call
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT))
from lab import device_name  # noqa: E402
from serve_clients import IdTokenizer, free_port, percentile, wait_healthy  # noqa: E402  (shared with serve_reasoning)


# ---- the server --------------------------------------------------------------------------------
def server_command(args, port: int) -> list[str]:
    common = ["--port", str(port), "--max-batch", str(args.max_batch), "--max-queue", str(args.requests),
              "--threshold", str(args.threshold), "--device", args.device, "--dtype", args.dtype, "--engine", args.engine]
    if args.pair == "shipped":
        replicas = ["--replicas", str(args.replicas), "--gpus-per-replica", str(args.gpus_per_replica)] \
            if args.replicas > 1 else []
        return [sys.executable, "-m", "hf_rstitch.cli.main", "serve", "--host", "127.0.0.1", *common, *replicas]
    return [sys.executable, str(Path(__file__).resolve()), "--serve-random-qwen2", *common, "--random-p", str(args.random_p)]


def serve_random_qwen2(argv: list[str]) -> int:
    """Server mode: the random-weight Qwen2 7B (LLM) / 1.5B (SLM) pair behind the same app.

    Random weights have no tokenizer; responses carry the token ids as text (``" 17 4 9"``) and
    requests send token-id prompts to /v1/completions. No EOS: every request runs to max_tokens."""
    import torch
    import uvicorn

    from hf_rstitch.serving.requests import RequestEngine
    from hf_rstitch.latency.profiler import random_qwen2
    from hf_rstitch.serve.app import ServerSettings, create_app

    p = argparse.ArgumentParser()
    for flag, tp in (("--port", int), ("--max-batch", int), ("--max-queue", int), ("--threshold", float),
                     ("--device", str), ("--dtype", str), ("--engine", str), ("--random-p", float)):
        p.add_argument(flag, type=tp, required=True)
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    llm, slm = random_qwen2("7b", dtype, a.device, seed=0), random_qwen2("1.5b", dtype, a.device, seed=1)
    for m in (llm, slm):
        m.generation_config.eos_token_id = None
    # random weights: near-uniform distributions, so entropy routing is meaningless; route at random instead
    # (each SLM step goes to the LLM with probability --random-p, which hands back after one token)
    from hf_rstitch.core.policies import RandomPolicy

    policy = RandomPolicy(a.random_p) if a.random_p > 0 else None
    engine = RequestEngine(llm, slm, threshold=a.threshold, max_batch=a.max_batch, policy=policy, engine=a.engine,
                           max_length=4096, max_waiting=a.max_queue)
    settings = ServerSettings(model_name="random-qwen2-7b+1.5b", max_context=4096, vocab_size=llm.config.vocab_size,
                              threshold=None if policy else a.threshold)
    uvicorn.run(create_app(engine, IdTokenizer(), settings), host="127.0.0.1", port=a.port, log_level="warning")
    return 0


# ---- the clients -------------------------------------------------------------------------------
def workload(args) -> list[dict]:
    """M request bodies: the shipped pair's test problems as chats, or random token-id prompts."""
    if args.pair == "shipped":
        from hf_rstitch.toyworld.pair import load_test_split

        problems = load_test_split()
        return [{"messages": [{"role": "user", "content": problems[i % len(problems)]["problem"]}],
                 "max_tokens": args.max_tokens, "temperature": 0} for i in range(args.requests)]
    import random

    rng = random.Random(0)
    return [{"prompt": [rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)], "max_tokens": args.max_tokens,
             "temperature": 0} for _ in range(args.requests)]


async def one_request(client, url: str, body: dict, timeout_s: float) -> dict:
    """One streaming request; what came back and when."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    rec = {"status": None, "ttft_s": None, "text": "", "chunks": 0, "done": False, "finish_reason": None, "usage": None}
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url + path, json={**body, "stream": True}) as r:
                rec["status"] = r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        rec["done"] = True
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        rec["error"] = chunk["error"]["message"]
                        continue
                    choice = chunk["choices"][0]
                    piece = choice["delta"].get("content", "") if "delta" in choice else choice["text"]
                    if piece and rec["ttft_s"] is None:
                        rec["ttft_s"] = time.perf_counter() - t0
                    rec["text"] += piece
                    rec["chunks"] += 1
                    rec["finish_reason"] = choice["finish_reason"] or rec["finish_reason"]
                    rec["usage"] = chunk.get("usage") or rec["usage"]
    except Exception as err:  # noqa: BLE001 -- a timeout or a dropped connection: recorded, counted incomplete
        rec["error"] = f"{type(err).__name__}: {err}"
    rec["latency_s"] = time.perf_counter() - t0
    rec["complete"] = bool(rec["status"] == 200 and rec["done"] and rec["finish_reason"] in ("stop", "length")
                           and rec["usage"])
    return rec


async def run_load(url: str, bodies: list[dict], clients: int, request_timeout_s: float, limit_s: float):
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for i, body in enumerate(bodies):
        queue.put_nowait((i, body))
    records: dict[int, dict] = {}

    async def worker(client):
        while not queue.empty():
            i, body = queue.get_nowait()
            records[i] = await one_request(client, url, body, request_timeout_s)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s), limits=limits) as client:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(clients))), limit_s)
        except asyncio.TimeoutError:
            print(f"wall-clock limit of {limit_s:.0f} s reached", file=sys.stderr)
        wall = time.perf_counter() - t0
    return [records.get(i) for i in range(len(bodies))], wall


# ---- checks and summary ------------------------------------------------------------------------
def solo_texts(args, bodies: list[dict], k: int) -> list[str]:
    """Greedy solo ``generate`` on the shipped pair for the first k chat bodies (the reference)."""
    import torch

    import hf_rstitch  # noqa: F401
    from hf_rstitch.eval.data import prompt_ids
    from hf_rstitch.toyworld.pair import load_pair

    llm, slm, tok = load_pair(args.device)
    out = []
    for body in bodies[:k]:
        ids = torch.tensor([prompt_ids(tok, body["messages"][0]["content"], instruction="")], device=args.device)
        seq = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                           stitch_threshold=args.threshold, max_new_tokens=args.max_tokens, do_sample=False,
                           stitch_engine="default")
        out.append(tok.decode(seq[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    return out


def engine_alone(args, bodies: list[dict]) -> dict:
    """The same requests through ``RequestEngine.run`` in this process, no server: the reference
    for what the HTTP layer costs."""
    import hf_rstitch  # noqa: F401
    from hf_rstitch.serving.requests import Request, RequestEngine
    from hf_rstitch.eval.data import prompt_ids
    from hf_rstitch.toyworld.pair import load_pair

    llm, slm, tok = load_pair(args.device)
    engine = RequestEngine(llm, slm, threshold=args.threshold, max_batch=args.max_batch, engine=args.engine)
    ids = [prompt_ids(tok, b["messages"][0]["content"], instruction="") for b in bodies]
    engine.run([Request(ids[0], max_new_tokens=8)])  # warm-up
    t0 = time.perf_counter()
    done = engine.run([Request(i, max_new_tokens=args.max_tokens) for i in ids])
    wall = time.perf_counter() - t0
    tokens = sum(len(c.tokens) for c in done.values())
    return {"wall_s": wall, "completion_tokens": tokens, "tokens_per_s": tokens / wall}


def summarize(records: list[dict | None], wall: float) -> dict:
    done = [r for r in records if r is not None]
    ok = [r for r in done if r["complete"]]
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tokens = sum(r["usage"]["completion_tokens"] for r in ok)
    stitch = {k: sum(r["usage"][k] for r in ok) for k in ("llm_tokens", "slm_tokens", "switches")}
    return {
        "requests": len(records), "answered": len(done), "lost": len(records) - len(done),
        "complete": len(ok), "incomplete": len(done) - len(ok),
        "statuses": sorted({r["status"] for r in done if r["status"] is not None}),
        "wall_s": wall, "requests_per_s": len(ok) / wall, "completion_tokens": tokens,
        "tokens_per_s": tokens / wall, **stitch,
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99), "latency_max_s": max(lat or [0]),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "mean_tokens_per_request": tokens / max(1, len(ok)),
    }


def markdown(meta: dict, s: dict) -> str:
    rows = [("clients x requests", f"{meta['clients']} x {meta['requests']}"), ("max batch", meta["max_batch"]),
            ("answered / complete / lost", f"{s['answered']} / {s['complete']} / {s['lost']}"),
            ("equal to solo generate", meta.get("solo_check", "not checked")),
            ("wall (s)", f"{s['wall_s']:.1f}"), ("requests/s", f"{s['requests_per_s']:.2f}"),
            ("completion tokens/s", f"{s['tokens_per_s']:.1f}"),
            ("engine alone, same requests, no server: tokens/s", f"{meta['engine_alone']['tokens_per_s']:.1f}"
             if "engine_alone" in meta else "not measured"),
            ("latency p50 / p99 (s)", f"{s['latency_p50_s']:.2f} / {s['latency_p99_s']:.2f}"),
            ("first token p50 / p99 (s)", f"{s['ttft_p50_s']:.2f} / {s['ttft_p99_s']:.2f}"),
            ("tokens per request", f"{s['mean_tokens_per_request']:.1f}"),
            ("LLM / SLM tokens, switches", f"{s['llm_tokens']} / {s['slm_tokens']}, {s['switches']}")]
    head = (f"# rstitch serve load test: {meta['pair']} pair on {meta['device_name']}\n\n"
            f"{meta['date']}, torch {meta['torch']}, transformers {meta['transformers']}, tau {meta['threshold']}, "
            f"max_tokens {meta['max_tokens']}, greedy, streaming, server threads {meta['server_threads']}.\n"
            f"Command: `{meta['command']}`\n\n")
    return head + "| | |\n| --- | ---: |\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-random-qwen2"]:
        return serve_random_qwen2(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", choices=["shipped", "random-qwen2"], default="shipped")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (N)")
    p.add_argument("--requests", type=int, default=64, help="requests in all (M)")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--prompt-tokens", type=int, default=128, help="random pair: prompt length")
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--engine", choices=["default", "fast"], default="default", help="request engine lanes")
    p.add_argument("--random-p", type=float, default=0.0,
                   help="random pair: route at random, each SLM step to the LLM with this probability (0: threshold)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of the server (OMP_NUM_THREADS)")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--time-limit", type=float, default=900.0, help="wall-clock limit of the whole load (s)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--replicas", type=int, default=1, help="shipped pair: server replicas on Ray Serve")
    p.add_argument("--gpus-per-replica", type=float, default=0.0)
    p.add_argument("--engine-alone", action="store_true",
                   help="shipped pair: also time the same requests through RequestEngine.run in-process")
    p.add_argument("--check-solo", type=int, default=0, help="compare the first K answers with solo generate")
    p.add_argument("--name", default="", help="results file suffix (default: pair and device)")
    args = p.parse_args(argv)

    import torch
    import transformers

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    threads = str(args.threads)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    proc = subprocess.Popen(server_command(args, port), env=env)
    torch.set_num_threads(args.threads)  # the solo reference, in this process
    try:
        wait_healthy(url, proc, args.startup_timeout)
        bodies = workload(args)
        asyncio.run(run_load(url, bodies[: min(2, len(bodies))], 1, args.request_timeout, args.time_limit))  # warm-up
        records, wall = asyncio.run(run_load(url, bodies, args.clients, args.request_timeout, args.time_limit))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    summary = summarize(records, wall)
    meta = {"pair": args.pair, "replicas": args.replicas, "server_threads": args.threads, "clients": args.clients,
            "requests": args.requests, "max_batch": args.max_batch, "max_tokens": args.max_tokens,
            "threshold": args.threshold, "device": args.device, "device_name": device_name(args.device),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/serve_load.py " + " ".join(argv), "server_exit_code": proc.returncode}
    if args.check_solo and args.pair == "shipped":
        k = min(args.check_solo, len(bodies))
        want = solo_texts(args, bodies, k)
        same = sum(r is not None and r["text"] == w for r, w in zip(records, want))
        meta["solo_check"] = f"{same} / {k}"
    if args.engine_alone and args.pair == "shipped":
        meta["engine_alone"] = engine_alone(args, bodies)
    name = args.name or f"{args.pair}_{args.device.split(':')[0]}"
    RESULTS.mkdir(exist_ok=True)
    doc = {**meta, "summary": summary}  # the summary only: per-request records are not kept
    (RESULTS / f"serve_load_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (RESULTS / f"serve_load_{name}.md").write_text(markdown(meta, summary))
    print(markdown(meta, summary), file=sys.stderr)
    print(json.dumps({**{k: meta[k] for k in ("pair", "device", "clients", "requests")}, **summary,
                      "solo_check": meta.get("solo_check")}))
    ok = summary["lost"] == 0 and summary["incomplete"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
