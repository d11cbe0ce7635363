"""Closed-loop streaming clients for the serving benchmarks, and the measurement window's summary.

:func:`closed_loop` keeps ``c`` streaming /v1/completions requests in flight against a server (each client sends
its next request when its last one ends), spread over several client processes so that parsing server-sent
events never becomes the bottleneck. Every request's record keeps when it started, ended, and when each chunk
of tokens arrived; :func:`summarize` turns the records into the numbers of one window: tokens received in it,
requests as the share of their tokens received in it, latencies of the requests completed in it. Client ``k``
of ``c`` sends requests ``k, k + c, k + 2c, ...`` (the engine alone's closed loop replays the same sequence per
slot). Token-id prompts and token-id text (:class:`IdTokenizer`): a random-weight pair has no tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


class IdTokenizer:
    """Text of a random-weight model's tokens: their ids (``decode`` is all the app needs)."""

    chat_template = None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" {i}" for i in ids)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s")


def wait_idle(url: str, timeout_s: float) -> bool:
    """Until the server runs and queues nothing (the last level's cancelled requests have left)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            h = httpx.get(url + "/health", timeout=2).json()
            if h.get("running", 0) == 0 and h.get("waiting", 0) == 0:
                return True
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    return False


async def one_request(client, url: str, body: dict, into: list | None = None) -> dict:
    """One streaming completion: status, start / end, (time, tokens) of each chunk, whether it completed. The
    record goes into ``into`` when it starts, so that a request still streaming when the clients stop counts the
    tokens it received (as the engine alone counts its requests in flight)."""
    rec = {"status": None, "start": time.monotonic(), "end": None, "ttft_s": None, "chunks": [], "complete": False,
           "target": body.get("max_tokens")}
    if into is not None:
        into.append(rec)
    done = reason = None
    try:
        async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                rec["error"] = (await r.aread()).decode(errors="replace")[:300]
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec["error"] = chunk["error"].get("message")
                    continue
                choice = chunk["choices"][0]
                n = len(choice["text"].split())
                if n:
                    now = time.monotonic()
                    rec["chunks"].append((now, n))
                    rec["ttft_s"] = rec["ttft_s"] if rec["ttft_s"] is not None else now - rec["start"]
                reason = choice.get("finish_reason") or reason
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 -- a dropped connection: recorded, counted incomplete
        rec["error"] = f"{type(err).__name__}: {err}"
    rec["end"] = time.monotonic()
    rec["complete"] = bool(rec["status"] == 200 and done and reason in ("stop", "length"))
    return rec


async def _clients(url: str, bodies: list[dict], first: int, step: int, n: int, t_start: float, t_end: float):
    """``n`` clients (ids ``first``, ``first + step``, ...; ``step * n`` clients in all) in a closed loop from
    ``t_start`` to ``t_end``; client ``k`` sends bodies ``k, k + step * n, ...``."""
    import httpx

    records: list[dict] = []

    async def client_loop(client, k: int):
        i = k
        while True:
            await one_request(client, url, bodies[i % len(bodies)], records)
            i += step * n

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        await asyncio.sleep(max(0.0, t_start - time.monotonic()))
        tasks = [asyncio.create_task(client_loop(client, first + j * step)) for j in range(n)]
        await asyncio.sleep(max(0.0, t_end - time.monotonic()))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return records


def _client_proc(url, bodies, first, step, n, t_start, t_end):
    """One client process's records, and the share of the closed loop's time it spent on a CPU."""
    cpu = time.process_time()
    records = asyncio.run(_clients(url, bodies, first, step, n, t_start, t_end))
    return records, (time.process_time() - cpu) / max(1e-9, t_end - t_start)


def run_clients(url: str, bodies: list[dict], concurrency: int, seconds: float, procs: int = 0,
                t_start: float | None = None) -> tuple[list, float, float]:
    """``concurrency`` clients in a closed loop for ``seconds`` from ``t_start`` (default: once the client processes
    have started): (every request's record, when they started, the busiest client process's CPU share)."""
    procs = procs or max(1, min(8, concurrency // 16))
    procs = min(procs, concurrency)
    while concurrency % procs:  # equal shares: client k of c then sends bodies k, k + c, ... (as the engine alone)
        procs -= 1
    t_start = t_start or time.monotonic() + 0.3 + 0.05 * procs  # the processes start meanwhile (forked: ~10 ms each)
    share = [concurrency // procs + (p < concurrency % procs) for p in range(procs)]
    with ProcessPoolExecutor(procs, mp_context=get_context("fork")) as pool:
        futures = [pool.submit(_client_proc, url, bodies, p, procs, share[p], t_start, t_start + seconds)
                   for p in range(procs)]
        done = [f.result() for f in futures]
    busiest = max(cpu for _, cpu in done)  # the busiest client process's CPU share (1: saturated)
    return [r for records, _ in done for r in records], t_start, busiest


def closed_loop(url: str, bodies: list[dict], concurrency: int, warmup_s: float, window_s: float,
                procs: int = 0) -> dict:
    """``concurrency`` clients for ``warmup_s + window_s``; the window's summary (:func:`summarize`), with the
    server's engine steps a second in the window (its /health ``steps``, read at the window's ends)."""
    import threading

    t_start = time.monotonic() + 0.8  # up to 8 client processes start meanwhile
    t0, t1, at = t_start + warmup_s, t_start + warmup_s + window_s, []
    watch = threading.Thread(target=lambda: at.extend(_engine_at(url, t) for t in (t0, t1)), daemon=True)
    watch.start()
    records, _, busiest = run_clients(url, bodies, concurrency, warmup_s + window_s, procs, t_start)
    watch.join(5)
    ok = len(at) == 2 and None not in at
    steps, busy, llm = ([b - a if None not in (a, b) else None for a, b in zip(*at)] if ok else (None, None, None))
    return {**summarize(records, t0, t1), "steps_per_s": steps / window_s if ok else None,
            "busy_share": busy / window_s if busy is not None else None,
            "busy_ms_a_step": 1e3 * busy / steps if busy is not None and steps else None,
            "llm_calls_a_step": llm / steps if llm is not None and steps else None,
            "client_cpu_max": busiest}


def _engine_at(url: str, when: float) -> tuple[int, float | None, int | None] | None:
    """The server's engine steps so far, the seconds its thread spent on them and the steps the LLM ran in
    (/health ``steps``, ``busy_s``, ``llm_calls``), read at ``when`` (time.monotonic())."""
    import httpx

    time.sleep(max(0.0, when - time.monotonic()))
    try:
        health = httpx.get(url + "/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    return (health["steps"], health.get("busy_s"), health.get("llm_calls")) if "steps" in health else None


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


def summarize(records: list[dict], t0: float, t1: float) -> dict:
    """One window ``[t0, t1]`` of a closed loop: tokens received in it per second; requests per second as the
    requests' share written in it (a request of ``target`` tokens that received ``k`` of them in the window counts
    ``k / target``: a smooth count that does not jump by whole requests when a window holds only a few, and reads
    the same as completions per second in a steady state); latencies (end - start) of the requests completed in it;
    first-token times of the requests whose first token came in it; errors seen anywhere in the run. Records:
    ``start``, ``end``, ``chunks`` of ``(time, tokens)``, ``target`` (tokens the request is to write), ``complete``,
    ``ttft_s``, ``status``."""
    window = t1 - t0
    done = [r for r in records if r.get("complete") and r.get("end") is not None and t0 <= r["end"] <= t1]
    in_window = [(r, sum(n for t, n in r["chunks"] if t0 <= t <= t1)) for r in records]
    tokens = sum(k for _, k in in_window)
    shares = sum(k / r["target"] for r, k in in_window if r.get("target"))
    errors = [r for r in records if r.get("end") is not None and not r.get("complete")
              and r.get("end") < t1 - 0.05 and (r.get("status") not in (None, 200) or r.get("error"))]
    lat = [r["end"] - r["start"] for r in done]
    ttft = [r["ttft_s"] for r in records if r.get("ttft_s") is not None and t0 <= r["start"] + r["ttft_s"] <= t1
            and not r.get("error")]  # first tokens in the window: not the level's first wave, all sent at once
    return {"window_s": window, "completed": len(done), "completed_per_s": len(done) / window,
            "requests_per_s": shares / window, "tokens_per_s": tokens / window, "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99), "ttft_p50_s": percentile(ttft, 50), "started": len(records),
            "errors": len(errors), "statuses": sorted({r["status"] for r in errors if r.get("status") is not None}),
            "first_error": next((r.get("error") for r in errors), None)}
