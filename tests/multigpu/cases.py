"""Shared set-up of the multi-device tests: a mixing threshold, prompts, and the on-disk case
that tensor-parallel workers (``tp_worker.py``, one process per rank) read back."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from tiny_models import left_pad, make_pair, prompt

ARCH = "qwen2-full"  # full attention, so batched runs are allowed
N_NEW = 24


def stitched(llm, slm, ids, tau, mask=None, **kw):
    return llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW,
                        do_sample=False, return_dict_in_generate=True, **kw)


def mixing_tau(llm, slm, ids) -> float:
    """The decile of both models' solo entropies at which the stitched run switches most often."""
    pool = stitched(llm, slm, ids, 1.0).stitch.entropies + stitched(llm, slm, ids, 0.0).stitch.entropies
    best = max(statistics.quantiles(pool, n=10), key=lambda tau: stitched(llm, slm, ids, tau).stitch.switches)
    trace = stitched(llm, slm, ids, best).stitch
    assert trace.llm_tokens and trace.slm_tokens and trace.switches, "the tiny pair does not mix at any decile"
    return best


def batch_with_early_stop(llm, slm, tau):
    """Two left-padded prompts and an EOS id that ends row 0 several steps before row 1, so finished
    rows are dropped from both caches mid-run (``Lane.keep_rows``)."""
    ids, mask = left_pad([prompt(11, seed=3), prompt(6, seed=4)])
    free = stitched(llm, slm, ids, tau, mask, eos_token_id=None, pad_token_id=2).sequences[:, ids.shape[1]:]
    for step in range(3, N_NEW - 3):
        eos = int(free[0, step])
        if eos not in free[0, :step].tolist() and eos not in free[1].tolist():
            return ids, mask, eos
    raise AssertionError("no token ends row 0 early; pick other prompts")


def write_case(root: Path, llm, slm) -> dict:
    """Save the pair and the requests under ``root``; return the single-process reference outputs."""
    llm.save_pretrained(root / "llm")
    slm.save_pretrained(root / "slm")
    ids = prompt(11, seed=3)
    tau = mixing_tau(llm, slm, ids)
    b_ids, b_mask, eos = batch_with_early_stop(llm, slm, tau)
    case = {"ids": ids.tolist(), "tau": tau, "batch_ids": b_ids.tolist(), "batch_mask": b_mask.tolist(), "eos": eos,
            "n_new": N_NEW, "seed": 7}
    (root / "case.json").write_text(json.dumps(case))
    return case


def tiny_pair():
    return make_pair(ARCH)
