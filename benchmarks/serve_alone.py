"""The request engine alone in the serving benchmarks' closed loop, and where its step's time goes.

:func:`engine_closed_loop` runs the closed loop of :mod:`serve_clients` with no HTTP (the "engine alone" that
``serve_reasoning.py`` holds the server against), counting its window by the same rule
(:func:`serve_clients.summarize`).

:class:`Phases` wraps, while installed, each lane's ``advance`` and ``account``, the scheduler's admission (which
requests join, a chunk of their prompts) and the executor's ``join`` (their rows' prefill into the batch, at a step's
start or ahead of it) of one
:class:`~hf_rstitch.batching.requests.RequestEngine`; per lane it counts calls, the batch a call ran (the rows
of the fast lane's graphs, its ``row_counts``: only the rows a call needs where the lane gathers them,
:mod:`hf_rstitch.fast.lane_compact`, else every row of its batch bucket), the rows that took part (the records the call made, or its run-ahead's ``account``), the columns
read, and the device time between CUDA events recorded around the call (from when the device reached it: the lane's
kernels, plus any wait for the host in between). ``summary`` gives ms a step and the share of the step's wall time
of each: ``slm``, ``llm``, ``joins`` (with ``joins_per_step``: the steps that admitted requests, from the engine's
``stats``), and ``other`` (host work the device did not overlap -- sampling, hand-over reads, bookkeeping -- and
idle time). On CPU (no CUDA) the times are the host's around each call.
"""

from __future__ import annotations

import contextlib
import gc
import time

import serve_clients as sc


class Phases:
    """Install on an engine, call :meth:`step` after each ``engine.step()``, :meth:`remove`, then :meth:`summary`."""

    def __init__(self, engine):
        import torch

        self.engine, self.torch = engine, torch
        self.cuda = torch.cuda.is_available()
        self.calls: dict[str, list] = {}  # phase -> [(host s, start event, end event, batch, columns, rows)]
        self.steps, self.wall_s, self._t0, self.removed, self.failed = 0, 0.0, None, False, False

    def install(self) -> "Phases":
        self._t0 = time.perf_counter()
        for role, lane in self.engine.lanes.items():
            name = str(role)
            lane.advance = self._timed(name, lane.advance, lane)
            if hasattr(lane, "account"):  # lanes that run ahead (the fast lane)
                lane.account = self._counted(name, lane.account)
        self._joins = self.engine.stats.get("joins", 0)  # steps that admitted requests (a join call a lane)
        sched, ex = self.engine.scheduler, self.engine.executor
        sched._admit = self._timed("joins", sched._admit, None)  # who joins, and a chunk of their prompts
        sched.read_ahead = self._timed("joins", sched.read_ahead, None)  # a chunk queued before a step's values
        ex.join = self._timed("joins", ex.join, None)  # their rows' prefill into the batch (at a step's start or ahead)
        self._ahead0 = self._ahead()
        self._t0 = time.perf_counter()
        return self

    def _ahead(self) -> tuple[int, int, int]:
        """(steps, steps whose next call was queued before their values were read, steps whose next call was queued
        right after) so far: the executor's stats."""
        st = getattr(self.engine.executor, "stats", {})
        return st.get("steps", 0), st.get("ahead", 0), st.get("ahead_after_read", 0)

    def step(self) -> None:
        self.steps += 1

    def remove(self) -> None:
        self.wall_s, self.removed = time.perf_counter() - self._t0, True
        self.joins = self.engine.stats.get("joins", 0) - getattr(self, "_joins", 0)
        (s0, a0, r0), (s1, a1, r1) = getattr(self, "_ahead0", (0, 0, 0)), self._ahead()
        self.ahead_share = (a1 - a0) / (s1 - s0) if s1 > s0 else None
        self.after_read_share = (r1 - r0) / (s1 - s0) if s1 > s0 else None
        for lane in self.engine.lanes.values():
            for attr in ("advance", "account"):
                lane.__dict__.pop(attr, None)
        self.engine.scheduler.__dict__.pop("_admit", None)
        self.engine.scheduler.__dict__.pop("read_ahead", None)
        self.engine.executor.__dict__.pop("join", None)

    def _event(self):
        if not self.cuda:
            return None
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _timed(self, name: str, fn, lane):
        calls = self.calls.setdefault(name, [])

        def timed(*args, **kwargs):
            seen = _seen(lane, args[0]) if lane is not None else 0
            ran = getattr(lane, "row_counts", {}).get("rows_run")  # the fast lane's rows run, over its life
            start, t0 = self._event(), time.perf_counter()
            out = fn(*args, **kwargs)
            try:  # the probe never fails a step
                host, end = time.perf_counter() - t0, self._event()
                if lane is None:
                    calls.append([host, start, end, 0, 0, 0])
                else:
                    seq, rows = args[0], args[2]
                    # rows the lane's graphs ran in this call (the fast lane's count), else every row
                    batch = lane.row_counts["rows_run"] - ran if ran is not None else seq.shape[0]
                    calls.append([host, start, end, batch, seq.shape[1] - seen, int(rows.sum())])
            except Exception:  # noqa: BLE001
                pass
            return out
        return timed

    def _counted(self, name: str, fn):
        calls = self.calls.setdefault(name, [])

        def counted(total, rows, resumed):
            if calls and hasattr(rows, "sum"):  # a run-ahead's rows, known one step later: the lane's latest call
                calls[-1][5] += int(rows.sum())
            return fn(total, rows, resumed)
        return counted

    def summary(self) -> dict:
        """Per phase: calls a step, ms a step (device where CUDA, else host), share of the step's wall time; per
        lane also the mean batch a call ran, rows that took part and columns read."""
        if self.cuda:
            self.torch.cuda.synchronize()
        steps = max(1, self.steps)
        step_ms = 1e3 * self.wall_s / steps
        out = {"steps": self.steps, "step_ms": step_ms, "ahead_share": getattr(self, "ahead_share", None),
               "after_read_share": getattr(self, "after_read_share", None)}
        busy = 0.0
        for name, calls in self.calls.items():
            ms = sum(s.elapsed_time(e) if s is not None else 1e3 * h for h, s, e, *_ in calls)
            busy += ms
            n = max(1, len(calls))
            out[name] = {"calls_per_step": len(calls) / steps, "ms_per_step": ms / steps,
                         "share": ms / max(1e-9, 1e3 * self.wall_s)}
            if name != "joins":
                out[name].update(batch=sum(c[3] for c in calls) / n, rows=sum(c[5] for c in calls) / n,
                                 columns=sum(c[4] for c in calls) / n)
        if "joins" in out:  # its calls: the admission, the batch's moves and a chunk read ahead; joins proper:
            out["joins"]["joins_per_step"] = getattr(self, "joins", 0) / steps
        out["other"] = {"ms_per_step": max(0.0, step_ms - busy / steps),
                        "share": max(0.0, 1 - busy / max(1e-9, 1e3 * self.wall_s))}
        return out


def _seen(lane, seq) -> int:
    """Columns the lane had read before this call (0 where it does not say)."""
    seen = getattr(lane, "n_seen", getattr(lane, "seen", None))  # the eager lane's n_seen, the fast lane's seen
    return seen if isinstance(seen, int) else seq.shape[1] - 1


def table(levels: dict) -> list[str]:
    """Markdown rows, one per (method, concurrency): ``levels`` maps ``"method@c"`` to a :meth:`Phases.summary`."""
    lines = ["| method | concurrency | step ms | SLM: ms (share), batch / rows / columns | LLM: ms (share), calls a "
             "step, batch / rows / columns | joins ms (share), joins a step | other ms (share) | steps run ahead |",
             "|---|---|---|---|---|---|---|---|"]
    for key, p in levels.items():
        method, c = key.split("@")
        cell = {}
        for name in ("slm", "llm"):
            x = p.get(name)
            cell[name] = "-" if not x or not x["calls_per_step"] else (f"{x['ms_per_step']:.2f} ({x['share']:.0%}), "
                                            + (f"{x['calls_per_step']:.2f}, " if name == "llm" else "")
                                            + f"{x['batch']:.0f} / {x['rows']:.1f} / {x['columns']:.1f}")
        j, o = p.get("joins", {"ms_per_step": 0, "share": 0}), p["other"]
        per = f", {j['joins_per_step']:.2f}" if "joins_per_step" in j else ""  # results written before it: none
        ahead = "-" if p.get("ahead_share") is None else f"{p['ahead_share']:.0%}"
        if p.get("after_read_share"):  # steps whose next call waited for the read, then went first
            ahead += f" (+{p['after_read_share']:.0%} after the read)"
        lines.append(f"| {method} | {c} | {p['step_ms']:.2f} | {cell['slm']} | {cell['llm']} | "
                     f"{j['ms_per_step']:.2f} ({j['share']:.0%}){per} | {o['ms_per_step']:.2f} ({o['share']:.0%}) | "
                     f"{ahead} |")
    return lines


def engine_closed_loop(engine, cfg: dict, ps: list, concurrency: int, warmup_s: float, window_s: float,
                       on_step=None) -> dict:
    """The request engine alone (no HTTP): ``concurrency`` requests in flight, a new one submitted as one ends (slot
    ``k`` sends requests ``k, k + c, ...`` of ``ps`` / ``cfg["lengths"]``, as the HTTP clients do); the window's
    summary (:func:`serve_clients.summarize`), its steps a second, and the phase profile of the warm-up's second
    half (:class:`Phases`). ``on_step(seconds since the start)``, if given, is called before each step (a probe of
    a caller's own, e.g. ``join_profile.py``'s profiler)."""
    with _frozen():  # as rstitch serve's process: the engine alone is the engine it serves with
        return _closed_loop(engine, cfg, ps, concurrency, warmup_s, window_s, on_step)


@contextlib.contextmanager
def _frozen():
    """The start-up objects frozen out of the garbage collector (``serve.driver.freeze_gc``, what a serving process
    does once built) while the loop runs; afterwards every object is back with the collector (``gc.unfreeze()``),
    so that an engine the caller drops next is freed. The permanent generation cannot be restored in part, and a
    fresh CPython 3.12 already holds a few hundred objects there (375 on 3.12.1, counted on the CPU box; 0 on 3.11
    and 3.13): unfreezing only where nothing was frozen before left each engine frozen for good under the H200
    image's Python 3.12.3 (its count not taken), its KV pools never freed (99.8 GiB kept after ``del engine``)."""
    from hf_rstitch.serve.driver import freeze_gc

    freeze_gc()
    try:
        yield
    finally:
        gc.unfreeze()


def _closed_loop(engine, cfg: dict, ps: list, concurrency: int, warmup_s: float, window_s: float, on_step) -> dict:
    import torch

    from hf_rstitch.batching.requests import Request
    from hf_rstitch.serve.driver import llm_calls  # as /health reports them

    lengths, role = cfg["lengths"], ("llm" if cfg["method"] == "llm_only" else None)
    started, records, slot_of, nxt = {}, [], {}, list(range(concurrency))  # slot k sends k, k + c, ... (the clients')

    def submit(k: int):
        i = nxt[k] % len(lengths)
        nxt[k] += concurrency
        rid = engine.submit(Request(ps[i], max_new_tokens=lengths[i], role=role,
                                    request_id=f"alone-c{concurrency}-{k}-{nxt[k]}"))
        started[rid] = {"start": time.monotonic(), "chunks": [], "ttft_s": None, "target": lengths[i]}
        slot_of[rid] = k

    t0 = time.monotonic()
    end = t0 + warmup_s + window_s
    for k in range(concurrency):
        submit(k)
    probe, probing = (t0 + warmup_s / 2, t0 + warmup_s), None  # phases: the warm-up's second half, off the window
    steps, llm_at = 0, None  # in the window; the engine's LLM calls when it began
    while time.monotonic() < end:
        probing = _probe(engine, probing, probe)
        if on_step is not None:
            on_step(time.monotonic() - t0)
        steps += time.monotonic() >= t0 + warmup_s
        if steps == 1 and llm_at is None:
            llm_at = llm_calls(engine)
        try:
            events = engine.step()
        except Exception as err:  # noqa: BLE001 -- StepFailed: that batch's requests end with errors, the loop goes on
            events = getattr(err, "events", None) or []
            if not events:
                raise
        now = time.monotonic()
        for ev in events:
            rec = started[ev.request_id]
            if ev.token is not None:
                rec["chunks"].append((now, 1))
                rec["ttft_s"] = rec["ttft_s"] if rec["ttft_s"] is not None else now - rec["start"]
            if ev.finished:
                rec.update(end=now, complete=ev.finish_reason == "length", status=200,
                           error=None if ev.finish_reason == "length" else ev.error or ev.finish_reason)
                records.append(started.pop(ev.request_id))
                submit(slot_of.pop(ev.request_id))
    llm = None if llm_at is None else llm_calls(engine) - llm_at  # the window's, before the drain
    for rid in list(started):
        engine.cancel(rid)
    while engine.has_work():
        engine.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if probing is not None and not probing.removed:  # the level ended before the span did
        probing.remove()
    try:  # the phase profile is a diagnosis: its failure costs the level nothing
        phases = probing.summary() if probing is not None and not probing.failed else None
    except Exception as err:  # noqa: BLE001
        phases = None
        print(f"phase profile failed: {type(err).__name__}: {err}", flush=True)
    return {**sc.summarize(records + list(started.values()), t0 + warmup_s, end), "phases": phases,
            "steps_per_s": steps / window_s, "llm_calls_a_step": llm / steps if llm is not None and steps else None}


def _probe(engine, probing, span: tuple[float, float]):
    """The phase profile (:class:`Phases`) installed at ``span[0]``, removed at ``span[1]``; counts
    the steps between (call before each step). Engines without lanes (the stand-in) are not probed."""
    now = time.monotonic()
    if probing is None:
        if not (span[0] <= now < span[1] and hasattr(engine, "lanes")):
            return None
        probing = Phases(engine)
        try:
            probing.install()
        except Exception as err:  # noqa: BLE001 -- a diagnosis: the level runs unprobed
            print(f"phase profile not installed: {type(err).__name__}: {err}", flush=True)
            probing.remove()
            probing.failed = True
    if probing.removed:
        return probing
    if now >= span[1]:
        probing.remove()
    else:
        probing.step()
    return probing
