"""The host's work a decode step on the CPU, without a GPU (``engine_profile.py --host-cpu``).

Stand-in lanes (:class:`StandIn`: fixed logits, entropy and greedy token, the fast lane's per-row records) make
every lane call free, so what is timed is the ``generate`` loop itself, the step, the policy and the stopping
check; plus one :class:`~hf_rstitch.fast.FastLane` call's host path with its model call stubbed out, and the
request engine's tensor operations a step outside its lanes' calls. CPU time of this process (steadier than the
wall on a shared machine) and tensor-operation counts (the same on any machine). :class:`StandIn` and
:func:`aten_ops` are also the lanes and the counter of ``tests/decode/test_host_ops.py`` (it imports this module,
which therefore imports the rest of the lab only inside the functions that time things).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from hf_rstitch.core.roles import Role


class StandIn:
    """A lane whose calls cost next to nothing: fixed logits, entropy and greedy token, and the fast lane's
    per-row records (:class:`hf_rstitch.fast.rows.RowSlots`); it runs ahead as the fast lane's graphs do."""

    run_ahead = True
    capacity = None

    def __init__(self, role: Role, vocab: int = 512, entropy: float = 0.3):
        from hf_rstitch.fast.rows import RowSlots

        self.role, self.vocab, self.rows, self.seen = role, vocab, RowSlots(1), 0
        self.logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
        self.h, self.top = torch.tensor([entropy]), self.logits.argmax(-1)

    def advance(self, seq, mask, rows, resumed, want_hidden=False):
        if self.seen == 0:
            self.rows.start([0] * seq.shape[0])
        self.seen = seq.shape[1]
        return self.logits, None, self.rows.records(self.role, self.seen, rows.tolist(), resumed.tolist(), None)

    def account(self, total, rows, resumed):
        return self.rows.records(self.role, total, rows.tolist(), resumed.tolist(), None)

    def entropy(self, logits):
        return self.h

    def greedy(self, logits):
        return self.top

    def keep_rows(self, index):
        pass

    def reset(self):
        self.seen = 0
        self.rows.clear()


def host_cpu(repeats: int = 5) -> dict:
    """Host microseconds a step of ``stitch_loop`` over stand-in lanes, and of one FastLane call's host path."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    from engine_profile import PROMPT
    from hf_rstitch.core.policies import EntropyPolicy
    from hf_rstitch.decode.loop import stitch_loop
    from hf_rstitch.hf import decode

    quick_stopping = getattr(decode, "quick_stopping", lambda criteria: None)  # as generate calls the loop (if any)

    ids = torch.randint(0, 500, (1, PROMPT), generator=torch.Generator().manual_seed(0))

    def loop(new: int):
        lanes = {Role.SLM: StandIn(Role.SLM), Role.LLM: StandIn(Role.LLM)}
        stop = StoppingCriteriaList([MaxLengthCriteria(PROMPT + new), EosTokenCriteria(511)])
        stitch_loop(lanes, ids, torch.ones_like(ids), EntropyPolicy(1.0), None, quick_stopping(stop) or stop)

    def lane_steps(n: int):
        lane, seq = stubbed_lane(n)
        yes = torch.ones(1, dtype=torch.bool)
        t0 = time.process_time()
        for t in range(PROMPT + 1, PROMPT + 1 + n):
            lane.advance(seq[:, :t], seq[:, :t], yes, ~yes)
        return time.process_time() - t0

    def cpu_seconds(fn) -> float:  # this process's CPU time: steadier than the wall on a shared machine
        t0 = time.process_time()
        fn()
        return time.process_time() - t0

    loop(64)
    best = {n: min(cpu_seconds(lambda: loop(n)) for _ in range(repeats)) for n in (32, 544)}
    ops = {n: aten_ops(lambda: loop(n))[0] for n in (32, 544)}
    lane_steps(64)
    return {"loop_us": 1e6 * (best[544] - best[32]) / 512, "loop_ops": (ops[544] - ops[32]) / 512,
            "lane_us": 1e6 * min(lane_steps(512) for _ in range(repeats)) / 512, "request_ops": request_ops()}


def request_host_ms(method: str, rows: int = 256, steps: int = 300, warm: int = 100) -> float:
    """CPU milliseconds a step of the request engine on the fast lanes' path (their CPU eager steps) with every
    model call stubbed (fixed logits), ``rows`` requests in a closed loop (a request that ends is replaced at once)
    of ``serve_reasoning.py``'s shapes: the LLM alone (``llm_only``) or stitched on replayed routes. What the host
    does a step for that many rows -- scheduling, the lanes' bookkeeping, picking, the update, joins' host side --
    which on a GPU is the device's idle time wherever it is not overlapped (the phase table's ``other``)."""
    import warnings

    import serve_reasoning as sr
    from hf_rstitch.batching.requests import Request
    from hf_rstitch.core import policies

    shape = sr.shapes(0.05)
    cfg = {"method": method, "pair": "tiny", "device": "cpu", "engine": "fast", "fast": {"graphs": False},
           "max_batch": rows, "llm_share": shape["llm_share"], "decisions": "device", "max_length": 512}
    llm, slm = sr.build_pair(cfg)
    repr_before = policies.ReplayPolicy.__repr__
    policies.ReplayPolicy.__repr__ = lambda self: "ReplayPolicy(stand-in)"  # every revision alike: not the engine's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fast engine's "eager on cpu" note
            engine = sr.build_engine(cfg, llm, slm)
        logits = torch.randn(rows, min(llm.config.vocab_size, slm.config.vocab_size))
        for lane in engine.lanes.values():
            stub_model(lane, logits)
            stub_model(lane.joins.twin(), logits)
        ps, lengths, role = sr.prompts(512, shape["prompt"]), shape[method], "llm" if method == "llm_only" else None
        nxt = iter(range(10**9))

        def submit():
            i = next(nxt) % len(lengths)
            engine.submit(Request(ps[i], max_new_tokens=lengths[i], role=role))

        for _ in range(rows):
            submit()
        t0 = None
        for k in range(warm + steps):
            if k == warm:
                t0 = time.process_time()
            for event in engine.step():
                if event.finished:
                    submit()
        return 1e3 * (time.process_time() - t0) / steps
    finally:
        policies.ReplayPolicy.__repr__ = repr_before


def request_ops() -> float:
    """Tensor operations a step of the request engine (one request, greedy, the SLM writing every token) outside
    its lanes' calls (eager tiny lanes; their calls are not counted)."""
    from engine_profile import PROMPT, build
    from hf_rstitch.batching.request_types import Request
    from hf_rstitch.batching.requests import RequestEngine

    model = build("tiny-qwen3", "cpu")
    engine = RequestEngine.of(model, model, threshold=1.0, max_batch=1, engine="default")
    inside = [False]
    for lane in engine.lanes.values():
        for name in ("advance", "entropy"):
            def call(*a, _fn=getattr(lane, name), **k):
                inside[0] = True
                try:
                    return _fn(*a, **k)
                finally:
                    inside[0] = False
            setattr(lane, name, call)

    def run(new: int):
        engine.run([Request(input_ids=list(range(10, 10 + PROMPT)), max_new_tokens=new, eos_token_id=[])])

    return (aten_ops(lambda: run(160), skip=inside)[0] - aten_ops(lambda: run(32), skip=inside)[0]) / 128


def aten_ops(fn, skip: list | None = None) -> tuple[int, object]:
    """Tensor operations ``fn()`` dispatches (each costs the host microseconds, on any device), not counting those
    while ``skip[0]`` is true; and what ``fn()`` returned."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += not (skip and skip[0])
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn()
    return Count.n, out


HOST_RESULT = "benchmarks/results/engine_host_cpu"


def write_host_rows(stem: Path, row: dict) -> None:
    """``--host-cpu``'s result: one row per label (a re-run replaces its label's row), as JSON and a table."""
    import lab

    stem = stem.with_suffix("")
    path = stem.with_suffix(".json")
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = [r for r in rows if r["label"] != row["label"]] + [row]
    table = ["| label | loop us a step | loop tensor ops a step | FastLane call host us | request engine tensor ops a "
             "step |", "|---|---|---|---|---|"]
    table += [f"| {r['label']} | {r['loop_us']} | {r['loop_ops']} | {r['lane_us']} | {r.get('request_ops')} |"
              for r in rows]
    lab.write_result(stem, {**lab.environment(["cpu"]), "rows": rows},
                     "Host cost a decode step on the CPU, stand-in lanes (`engine_profile.py --host-cpu`): the "
                     "generate loop's own work (CPU time of this process, min of 5) and one FastLane call's host "
                     "path with its model call stubbed out; the request engine's tensor operations a step outside its "
                     "lanes' calls. A row of another revision: run with its hf_rstitch first on PYTHONPATH.\n\n"
                     + "\n".join(table) + "\n")


def stubbed_lane(n: int):
    """A FastLane (eager, CPU) of the tiny shape whose model call is a stub: its host path alone."""
    from engine_profile import PROMPT, build
    from hf_rstitch.fast import FastConfig, FastLane

    model = build("tiny-qwen3", "cpu")
    lane = FastLane(model, Role.SLM, model.config.vocab_size, PROMPT + n + 8, FastConfig(graphs=False))
    stub_model(lane, torch.randn(1, model.config.vocab_size))
    seq = torch.ones(1, PROMPT + n + 1, dtype=torch.long)
    lane.advance(seq[:, :PROMPT], seq[:, :PROMPT], torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool))
    return lane, seq


def stub_model(lane, logits: torch.Tensor) -> None:
    """``lane``'s model calls (eager and graph-step alike) become a stub: the cache's write offset moves on as a
    call's would, and the call returns the first rows of ``logits`` -- what is left of a call is its host path."""
    import contextlib

    def call(ids, n_real, hidden):
        lane.cache.pos.add_(n_real)
        return logits[: ids.shape[0]], None

    lane.forward = lane._decode_step = lane._compiled_bucket = call
    lane.model_code = lambda *a, **k: contextlib.nullcontext()  # a graph replay runs no model code either
