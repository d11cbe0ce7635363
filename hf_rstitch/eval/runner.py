"""Run methods x problems and append one JSONL record per (dataset, problem, method).

Each record is written (and fsync'd) as soon as its sample finishes, so a run that dies is
resumed by skipping the pairs already on disk, and a finished run can be re-tabulated from
the file alone. Latency is the wall clock of the ``generate`` call only, with
``torch.cuda.synchronize`` before and after on CUDA; each method gets one short untimed
warm-up call first. Batch size 1 throughout. Reporting lives in :mod:`.report`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from .data import Problem, prompt_ids
from ..latency.profiler import synchronize
from .grading import grade, profile_for
from .methods import Method, eos_ids

WARMUP_TOKENS = 16


class RecordStore:
    """Append-only JSONL of records; a torn last line (killed mid-write) is dropped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # torn write from an interrupted run
                    continue
                raise ValueError(f"{self.path}:{i + 1}: corrupt record (not JSON); fix or delete that line.") from None
        return records

    def done(self) -> set[tuple[str, str, str]]:
        return {key(r) for r in self.load()}

    def _repair(self) -> None:
        """Cut a partial last line so the next append starts on a fresh line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


class FolderBusy(ValueError):
    """Another run holds the output folder's lock."""


class OutLock:
    """Exclusive use of an output folder for one run: a second run on the same folder (another
    process, or another thread of this one) is refused instead of writing every record twice.

    An OS file lock on ``<folder>/.lock`` (``flock``; ``msvcrt.locking`` on Windows): the OS drops
    it when the process dies, so a killed run leaves nothing to clean up.
    """

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / ".lock"
        self._fh: Any = None

    def __enter__(self) -> "OutLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            _lock_file(fh, True)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise FolderBusy(f"{self.path.parent} is in use by another run ({holder}); wait for it to finish, or "
                             "give this run another --out (shards: one --out each, see --shard).") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: Any) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.truncate(0)
            _lock_file(fh, False)
            fh.close()


def _lock_file(fh: Any, lock: bool) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK if lock else msvcrt.LK_UNLCK, 1)
        return
    fcntl.flock(fh.fileno(), (fcntl.LOCK_EX | fcntl.LOCK_NB) if lock else fcntl.LOCK_UN)


def key(record: dict[str, Any]) -> tuple[str, str, str]:
    return (record["dataset"], str(record["id"]), record["method"])


def timed_run(method: Method, input_ids: torch.Tensor, **kw: Any) -> tuple[list[int], dict[str, Any], float]:
    """``method.run`` timed as wall clock, device-synchronised before and after."""
    synchronize(input_ids.device)
    t0 = time.perf_counter()
    new_ids, counts = method.run(input_ids, **kw)
    synchronize(input_ids.device)
    return new_ids, counts, time.perf_counter() - t0


def make_record(problem: Problem, method: Method, tokenizer: Any, prompt_len: int, new_ids: list[int],
                counts: dict[str, Any], latency: float, eos_ids: set[int], max_new_tokens: int,
                save_traces: bool = False) -> dict[str, Any]:
    """One JSON-ready record: output text, per-model counts, latency and correctness."""
    counts = dict(counts)
    trace = counts.pop("_trace", None)
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    result = grade(text, problem.answer, profile_for(problem.dataset))
    main = {k: counts.pop(k, 0) for k in ("new_tokens", "llm_tokens", "slm_tokens", "switches")}
    rec: dict[str, Any] = {
        "dataset": problem.dataset, "id": problem.id, "method": method.name, "kind": method.kind,
        "param": method.param, "label": method.label, "answer": problem.answer,
        "correct": result.correct, "extracted": result.extracted, "extracted_by": result.extracted_by,
        "latency_s": latency, "prompt_tokens": prompt_len, **main,
        "hit_eos": bool(new_ids) and new_ids[-1] in eos_ids,
        "truncated": len(new_ids) >= max_new_tokens and not (new_ids and new_ids[-1] in eos_ids),
        "counts": counts, "output": text,
    }
    if save_traces and trace is not None:
        rec["trace"] = trace.to_dict()
    return rec


def _progress(total: int, enabled: bool) -> Any:
    """A progress bar to use as ``with _progress(...) as bar`` (``bar`` is None without tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with huggingface-hub
        return contextlib.nullcontext()
    return tqdm(total=total, disable=not enabled, file=sys.stderr, unit="sample", dynamic_ncols=True)


def tick(bar: Any, rec: dict[str, Any], note: str = "") -> None:
    """One finished record on the progress bar (if any): where it is, pass or fail."""
    if bar is not None:
        bar.set_postfix_str(f"{rec['dataset']}/{rec['id']} {rec['method']} {'ok' if rec['correct'] else 'x'} {note}",
                            refresh=False)
        bar.update(1)


def _check_unique(names: list[str]) -> None:
    """Refuse (ValueError) methods named twice: each (dataset, problem, method) is one record."""
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"methods {twice} appear more than once; each (dataset, problem, method) is one record. "
                         "List every threshold / p / router once.")


def run_eval(methods: list[Method], problems: Iterable[Problem], tokenizer: Any, store: RecordStore, *,
             device: torch.device | str = "cpu", instruction: str = "", chat_template: bool = True,
             max_new_tokens: int = 8192, warmup: bool = True, progress: bool = True,
             save_traces: bool = False) -> list[dict[str, Any]]:
    """Run every method on every problem not already in ``store``; returns the new records.

    Problems are the outer loop, so an interrupted run leaves complete rows of methods for
    the problems it reached (per-sample speedups need the LLM-only baseline on the same ids).
    """
    device = torch.device(device)
    problems = list(problems)
    _check_unique([m.name for m in methods])
    done = store.done()
    todo = [(p, m) for p in problems for m in methods if (p.dataset, p.id, m.name) not in done]
    if not todo:
        return []
    eos = eos_ids(methods[0].llm, methods[0].slm)
    prompts: dict[tuple[str, str], list[int]] = {}

    def ids_for(p: Problem) -> list[int]:
        if (p.dataset, p.id) not in prompts:
            prompts[(p.dataset, p.id)] = prompt_ids(tokenizer, p.problem, instruction, chat_template)
        return prompts[(p.dataset, p.id)]

    if warmup:
        first = torch.tensor([ids_for(todo[0][0])], device=device)
        for m in {m.name: m for _, m in todo}.values():
            m.run(first, max_new_tokens=min(WARMUP_TOKENS, max_new_tokens))
    new_records = []
    with _progress(len(todo), progress) as bar:
        for problem, method in todo:
            ids = ids_for(problem)
            input_ids = torch.tensor([ids], device=device)
            new_ids, counts, latency = timed_run(method, input_ids)
            rec = make_record(problem, method, tokenizer, len(ids), new_ids, counts, latency, eos,
                              max_new_tokens, save_traces)
            store.append(rec)
            new_records.append(rec)
            tick(bar, rec, f"{latency:.1f}s")
    return new_records
