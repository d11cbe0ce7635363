"""``rstitch eval`` under ``torchrun`` / ``accelerate launch``: each process its shard, one report.

Both launchers start one process per GPU (or per machine slot) and set ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Each process then evaluates the problems
``i`` with ``i % WORLD_SIZE == RANK`` on ``cuda:LOCAL_RANK`` (or the device asked for), into
``--out/rank<RANK>/`` (resumable, like any run). When every process is done -- a barrier over
``torch.distributed`` (gloo, so CPU-only runs work too) -- rank 0 merges the records into
``--out/records.jsonl`` and writes the one report. An explicit ``--shard`` turns this off.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from .config import RECORDS, RUN_META, EvalConfig

BARRIER_TIMEOUT = timedelta(days=7)  # a process may finish its shard days before the slowest one


def launched() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` under a launcher with more than one process, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0") or 0)


def rank_device(device: str, local_rank: int) -> str:
    """``auto`` / ``cuda`` -> this process's GPU when there is one; an explicit device is kept."""
    if device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            return f"cuda:{local_rank % torch.cuda.device_count()}"
        return "cpu" if device == "auto" else device
    return device


def evaluate_launched(cfg: EvalConfig, rank: int, world: int, local_rank: int, evaluate: Callable[..., dict],
                      **models: Any) -> dict[str, Any]:
    """Evaluate this process's shard with ``evaluate`` (:func:`hf_rstitch.eval.evaluate`), wait for all, and
    (rank 0) merge and report."""
    import torch.distributed as dist

    out = Path(cfg.out)
    mine = replace(cfg, shard=f"{rank}/{world}", out=str(out / f"rank{rank}"), device=rank_device(cfg.device, local_rank),
                   progress=cfg.progress and rank == 0, plots=False)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    try:
        summary = evaluate(mine, **models)
        dist.barrier()
        if rank == 0:
            _merge(out, world)
            summary = evaluate(replace(cfg, report_only=True))
        dist.barrier()  # the others return once the merged report exists
    finally:
        if started:
            dist.destroy_process_group()
    return summary


def _merge(out: Path, world: int) -> None:
    """``out/rank*/records.jsonl`` -> ``out/records.jsonl`` and ``run.json`` (rank 0's, with the world size)."""
    from .runner import RecordStore, key

    seen, lines = set(), []
    for r in range(world):
        for rec in RecordStore(out / f"rank{r}" / RECORDS).load():
            if key(rec) not in seen:
                seen.add(key(rec))
                lines.append(json.dumps(rec, ensure_ascii=False))
    (out / RECORDS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    meta = json.loads((out / "rank0" / RUN_META).read_text())
    meta["world_size"] = world
    (out / RUN_META).write_text(json.dumps(meta, indent=2, default=str) + "\n")
