"""Host time of the stitch loop per step, with lanes that compute nothing (CPU, ~1 min).

    PYTHONPATH=.:benchmarks python benchmarks/loop_overhead.py [--out-dir benchmarks/results]

On a GPU the loop's host work between a step's wait for the device and the next launch is time the
device sits idle (0.17-0.21 ms a step for the 7B through ``generate`` on an H200,
``engine_host_profile*_nvidia_h200.json``). This measures the loop's own share of it, without a GPU
(the part of a step from the wait's return to the next lane call), and its whole host time a step:
:func:`hf_rstitch.engine.loop.stitch_loop` drives two null lanes that keep the fast lane's host
bookkeeping (its per-row call records, :class:`hf_rstitch.fast.rows.RowSlots`) and return fixed
logits over a small vocabulary, so what is timed is the loop: routing, the policy, the token pick,
transformers' stopping criteria, the flags' copy and the trace records. Routes: every token the LLM's,
every token the SLM's, and R-Stitch's threshold policy with logits that alternate between the two
models in runs of four. Writes ``loop_overhead_cpu.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import LogitsProcessorList, MaxLengthCriteria, StoppingCriteriaList

import lab
from hf_rstitch import EntropyPolicy, ReplayPolicy
from hf_rstitch.core.entropy import normalized_entropy
from hf_rstitch.core.roles import Role
from hf_rstitch.engine import loop
from hf_rstitch.engine.loop import stitch_loop
from hf_rstitch.fast.rows import RowSlots

VOCAB = 256


class NullLane:
    """A lane that runs no model: fixed logits, the fast lane's per-row records."""

    run_ahead = False

    def __init__(self, role: Role, rows: int, logits: torch.Tensor):
        self.role, self.vocab, self.capacity = role, VOCAB, 1 << 20
        self.slots, self.logits, self.seen = RowSlots(rows), logits, 0

    def advance(self, seq, mask, rows, resumed, want_hidden=False):
        if self.seen == 0:
            self.slots.start([0] * seq.shape[0])
        self.seen = seq.shape[1]
        step = seq.shape[1] % len(self.logits)
        logits = self.logits[step].expand(seq.shape[0], -1).to(torch.float32, copy=True)
        return logits, None, self.slots.records(self.role, seq.shape[1], rows.tolist(), resumed.tolist(), None)

    def keep_rows(self, index):
        self.slots.keep([int(i) for i in index])

    def reset(self):
        self.seen = 0
        self.slots.clear()

    def entropy(self, logits):
        return normalized_entropy(logits)

    def greedy(self, logits):
        return None


def lanes_for(route: str, batch: int) -> tuple[dict, object]:
    """Null lanes and a policy for ``route``: "llm" / "slm" (replayed), "stitched" (the threshold policy)."""
    sharp, flat = torch.full((VOCAB,), -30.0), torch.zeros(VOCAB)
    sharp[7] = 0.0
    if route == "stitched":  # the SLM is unsure at every fourth column: the LLM writes it, then hands back
        slm = torch.stack([flat if i % 4 == 0 else sharp for i in range(4)])
        return {Role.SLM: NullLane(Role.SLM, batch, slm), Role.LLM: NullLane(Role.LLM, batch, sharp[None])}, \
            EntropyPolicy(0.5)
    lanes = {Role.SLM: NullLane(Role.SLM, batch, sharp[None]), Role.LLM: NullLane(Role.LLM, batch, sharp[None])}
    return lanes, ReplayPolicy([[route] * 4096] * batch)


def time_loop(route: str, batch: int, steps: int, repeats: int) -> tuple[float, float]:
    """Median microseconds of host time a step over ``repeats`` generations of ``steps`` tokens, and the
    median of the critical part: from the step's wait for the device returning to the next lane call
    (on a GPU, the time the device sits idle)."""
    ids = torch.randint(10, VOCAB, (batch, 16))
    out, marks = [], []
    wait, advance = loop._HostFlags.wait, NullLane.advance

    def timed_wait(flags):
        got = wait(flags)
        marks.append(("waited", time.perf_counter()))
        return got

    def timed_advance(lane, *args, **kwargs):
        marks.append(("advance", time.perf_counter()))
        return advance(lane, *args, **kwargs)

    loop._HostFlags.wait, NullLane.advance = timed_wait, timed_advance
    try:
        for _ in range(repeats):
            lanes, policy = lanes_for(route, batch)
            stop = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + steps)])
            start = time.perf_counter()
            result = stitch_loop(lanes, ids, torch.ones_like(ids), policy, LogitsProcessorList(), stop)
            out.append((time.perf_counter() - start) / steps)
            assert result.sequences.shape[1] == ids.shape[1] + steps
    finally:
        loop._HostFlags.wait, NullLane.advance = wait, advance
    gaps = sorted(b - a for (m, a), (n, b) in zip(marks, marks[1:]) if m == "waited" and n == "advance")
    out.sort()
    return 1e6 * out[len(out) // 2], 1e6 * gaps[len(gaps) // 2]


def cpu_name() -> str:
    """The CPU's model name (Linux), else "cpu"."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for route in ("llm", "slm", "stitched"):
        for b in args.batches:
            step_us, critical_us = time_loop(route, b, args.steps, args.repeats)
            rows.append({"route": route, "batch": b, "us_per_step": step_us, "critical_us": critical_us})
            print(rows[-1], flush=True)
    result = {"environment": lab.environment(["cpu"]), "args": vars(args), "rows": rows}
    result["environment"]["devices"] = [cpu_name()]
    env = result["environment"]
    lines = [f"# Stitch loop host time per step, null lanes, {env['devices'][0]}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}, one thread; median of "
             f"{args.repeats} generations of {args.steps} tokens; lanes compute nothing (fixed logits over "
             f"{VOCAB} ids, "
             "the fast lane's per-row records). Each cell: host microseconds a step, and in brackets the part from the "
             "step's wait for the device returning to the next lane call (on a GPU the device waits through it).", "",
             "| route | " + " | ".join(f"B = {b} (us/step)" for b in args.batches) + " |",
             "|---|" + "---|" * len(args.batches)]
    for route in ("llm", "slm", "stitched"):
        cells = [f"{r['us_per_step']:.0f} ({r['critical_us']:.0f})" for r in rows if r["route"] == route]
        lines.append(f"| {route} | " + " | ".join(cells) + " |")
    lab.write_result(Path(args.out_dir) / "loop_overhead_cpu", result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
