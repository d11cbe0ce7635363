"""The candidates the GEMV tuner times for a shape no tuning table holds: a shortlist per kernel and tier.

Why: each candidate is a Triton kernel to build (~0.7 s of a compile thread) and a graph to time; the search
spaces (:data:`hf_rstitch.fast.kernels.gemv.TIER_CANDIDATES`, :data:`hf_rstitch.fast.kernels.gated.TIER_CANDIDATES`)
hold 6-20 candidates a tier, and a fresh machine's first call spent most of its seconds building and timing them.
A shortlist keeps the candidates that chose within 1 % of the whole space's best for every product shape of the
zoo's models (a greedy cover of the timings ``tools/gemv_tuning_table.py`` records,
``benchmarks/results/gemv_candidates_<gpu>.md``); None keeps the whole space. ``HF_RSTITCH_TUNE=full`` times the
whole space (the shipped tables of :mod:`.tuning_cache` are made so).

This module is not part of the tuning table's key (:func:`.tuning_cache.identity` hashes the kernels and their
spaces): a shortlist decides what a lane times, not what a configuration means.
"""

from __future__ import annotations

import os

from .gemv import MAX_ROWS, WIDE_ROWS, GemvConfig

ENV = "HF_RSTITCH_TUNE"  # "full": every candidate of the space; "short" (default): the shortlist
# kernel -> {tier rows: candidates (None: the whole space)}. The few-rows tier (catch-ups of 2..16 tokens): the
# greedy cover at 1 % of the H100's timings over the 7 models' 32 product shapes (20 -> 3 candidates for the
# products, 6 -> 1 for the gated MLP; cuBLAS, the baseline, is always timed too). The one-row tier, where a
# decoded token's time goes, keeps its whole space: its cover needs 9 of 14 even at 2 %. The 17..64-row tier:
# no timings yet (results/gemv_candidates_nvidia_h100_80gb_hbm3.md).
SHORTLISTS: dict[str, dict[int, tuple | None]] = {
    "gemv": {1: None, MAX_ROWS: (GemvConfig(32, 256, 4, 4, MAX_ROWS), GemvConfig(32, 128, 4, 4, MAX_ROWS, 4),
                                 GemvConfig(32, 256, 4, 2, MAX_ROWS)), WIDE_ROWS: None},
    "gated": {1: None, MAX_ROWS: (GemvConfig(32, 128, 4, 2, MAX_ROWS),), WIDE_ROWS: None},
}


def candidates(kind: str, top: int, space: dict) -> tuple:
    """What the tuner times for ``kind``'s tier ``top``: its shortlist, or the whole ``space`` (``kind``'s search
    space, tier rows -> candidates) where there is none or ``HF_RSTITCH_TUNE=full``."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting not in ("", "short", "full"):
        raise ValueError(f"{ENV} must be 'full' (every candidate) or 'short' (the default: the shortlist), "
                         f"got {setting!r}")
    short = SHORTLISTS[kind].get(top)
    return space[top] if setting == "full" or short is None else short
