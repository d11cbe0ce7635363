"""Pick R-Stitch's threshold tau from a sweep on a dev split: pure arithmetic over sweep points.

``rstitch tune`` decodes a dev split with the LLM alone and at several thresholds and hands the
points here; the LLM alone counts as tau = 0 (stitching at 0 hands every token to the LLM), so it is
the choice when no larger threshold meets the budgets. Two budgets, usable together:

* ``max_drop``: accuracy may fall at most this many points below the LLM alone's;
* ``target_speedup``: the latency model's predicted speed-up over the LLM alone must reach this.

Among the thresholds that meet every budget given, the choice is the fastest one (highest predicted
speed-up; without a latency model, the smallest LLM-token share), ties going to the more accurate,
then to the larger tau. With only a speed target, the most accurate point that reaches it wins.
No torch, no models: the sweep lives in :mod:`hf_rstitch.cli.tune`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SweepPoint:
    """One decoding setting measured on the dev split."""

    threshold: float | None  # None for a point that is not a plain threshold (the router)
    accuracy: float  # percent correct
    llm_share: float  # share of new tokens the LLM wrote, in [0, 1]
    mean_tokens: float  # new tokens per problem
    speedup: float | None = None  # predicted latency of the LLM alone / of this point
    label: str = "rstitch"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Choice:
    """The chosen point (None when no threshold meets the budgets) and why."""

    point: SweepPoint | None
    reason: str


def check_budgets(max_drop: float | None, target_speedup: float | None) -> None:
    if max_drop is None and target_speedup is None:
        raise ValueError("give an accuracy budget (--max-drop POINTS, e.g. 1.0) and/or a speed target "
                         "(--target-speedup X, needs --latency).")
    if max_drop is not None and not (math.isfinite(max_drop) and max_drop >= 0):
        raise ValueError(f"--max-drop is in accuracy points and must be >= 0, got {max_drop!r}.")
    if target_speedup is not None and not (math.isfinite(target_speedup) and target_speedup > 0):
        raise ValueError(f"--target-speedup must be a positive factor (e.g. 2.0), got {target_speedup!r}.")


def _speed_key(p: SweepPoint) -> float:
    return p.speedup if p.speedup is not None else -p.llm_share


def choose(points: list[SweepPoint], reference_accuracy: float, max_drop: float | None = None,
           target_speedup: float | None = None) -> Choice:
    """The threshold that meets the budgets (see the module docstring); ``points`` are thresholds only."""
    check_budgets(max_drop, target_speedup)
    if target_speedup is not None and any(p.speedup is None for p in points):
        raise ValueError("--target-speedup needs a predicted speed-up for every threshold: pass --latency PROFILE.")
    floor = None if max_drop is None else reference_accuracy - max_drop
    ok = [p for p in points
          if (floor is None or p.accuracy >= floor - 1e-9)
          and (target_speedup is None or p.speedup >= target_speedup - 1e-9)]
    if not ok:
        best = max(points, key=lambda p: (_speed_key(p), p.accuracy)) if points else None
        budget = " and ".join(x for x in (
            None if floor is None else f"accuracy >= {floor:.2f} %",
            None if target_speedup is None else f"speed-up >= {target_speedup:g}x") if x)
        hint = "" if best is None else f"; the fastest point was tau={best.threshold:g} at {best.accuracy:.2f} %"
        return Choice(None, f"no threshold meets {budget}{hint}. Loosen the budget, add thresholds, or use more data.")
    if max_drop is None:  # speed target only: the most accurate point that is fast enough
        pick = max(ok, key=lambda p: (p.accuracy, _speed_key(p), p.threshold))
        return Choice(pick, f"most accurate threshold with predicted speed-up >= {target_speedup:g}x")
    pick = max(ok, key=lambda p: (_speed_key(p), p.accuracy, p.threshold))
    speed = "highest predicted speed-up" if pick.speedup is not None else "smallest LLM-token share"
    return Choice(pick, f"{speed} within {points_text(max_drop)} of the LLM alone ({reference_accuracy:.2f} %)"
                  + ("" if target_speedup is None else f" and >= {target_speedup:g}x"))


def points_text(value: float) -> str:
    """``1 point``, ``0.5 points``, ``2 points``: accuracy points with their noun in the right number."""
    return f"{value:g} point" + ("" if value == 1 else "s")


def table(points: list[SweepPoint], chosen: SweepPoint | None = None) -> str:
    """A markdown table of the sweep; the chosen row is marked."""
    rows = ["| point | tau | acc % | LLM share | tokens | pred. speed-up | |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for p in points:
        tau = "--" if p.threshold is None else f"{p.threshold:g}"
        speed = "--" if p.speedup is None else f"{p.speedup:.2f}x"
        name = {"llm": "LLM alone", "rstitch": "R-Stitch", "router": "R-Stitch+ router"}.get(p.label, p.label)
        mark = "<- chosen" if p is chosen else ""
        rows.append(f"| {name} | {tau} | {p.accuracy:.2f} | {p.llm_share:.3f} | {p.mean_tokens:.1f} | {speed} | {mark} |")
    return "\n".join(rows)
