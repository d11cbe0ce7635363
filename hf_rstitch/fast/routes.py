"""Synthetic routes for speed measurements on random-weight models (replayed by ReplayPolicy).

A route is a list of ``"slm"`` / ``"llm"``, one per new token. These builders fix the two things
that set a stitched decode's cost -- the share of LLM tokens and how often control switches --
and place the runs deterministically from a seed. They say nothing about where a real R-Stitch
run would switch.
"""

from __future__ import annotations

import random


def route(n_tokens: int, llm_tokens: int, llm_run: float, seed: int = 0) -> list[str]:
    """``n_tokens`` roles with ``llm_tokens`` LLM tokens in runs of mean length ``llm_run``.

    The route starts on the SLM (R-Stitch starts there). Run lengths of both models vary
    around their means (each run's length is drawn from a spread of +-50 %), then the counts
    are made exact.
    """
    if not 0 <= llm_tokens <= n_tokens:
        raise ValueError(f"llm_tokens must be in [0, {n_tokens}], got {llm_tokens}")
    if llm_run < 1:
        raise ValueError(f"llm_run (mean LLM run length) must be >= 1, got {llm_run}")
    slm_tokens = n_tokens - llm_tokens
    if llm_tokens == 0 or slm_tokens == 0:
        return ["llm" if llm_tokens else "slm"] * n_tokens
    runs = max(1, min(round(llm_tokens / llm_run), llm_tokens, slm_tokens))
    rng = random.Random(seed)
    llm = _split(llm_tokens, runs, rng)
    slm = _split(slm_tokens, runs, rng)  # one SLM run before each LLM run
    out: list[str] = []
    for s, l in zip(slm, llm):
        out += ["slm"] * s + ["llm"] * l
    return out


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """``parts`` positive integers summing to ``total``, each near ``total / parts``."""
    mean = total / parts
    weights = [mean * rng.uniform(0.5, 1.5) for _ in range(parts)]
    scale = (total - parts) / sum(weights)
    sizes = [1 + int(w * scale) for w in weights]
    for i in range(total - sum(sizes)):  # hand out the rounding remainder
        sizes[i % parts] += 1
    return sizes


def switches(roles: list[str]) -> int:
    return sum(a != b for a, b in zip(roles, roles[1:]))
