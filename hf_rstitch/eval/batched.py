"""Batched evaluation: problems x methods -> one record per row, and :func:`sweep` over them.

The harness (:func:`hf_rstitch.eval.evaluate`) times every problem alone at batch size 1, which
is what the paper's latency means. Accuracy and per-model token counts do not need that: batched
stitching gives every row the tokens it gets alone (``tests/decode/test_batch.py``), so
:func:`batched_records` decodes left-padded batches through the public ``generate``
(``Method.run_batch``) and writes the harness's records (:func:`~.runner.make_record`, the one
grader of :mod:`.grading`), and :func:`sweep` reduces them to one summary row per method. A
batched record's ``latency_s`` is the wall time of its whole batch (``batch_size`` says how many
rows shared it). Examples, the router's evaluation and the lab's scripts measure through here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..latency.profiler import synchronize
from .data import Problem, prompt_ids
from .methods import GenSettings, Method, build_methods, eos_ids
from .runner import make_record


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` ids and attention mask, left-padded (the decode loop's layout)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def as_problems(rows: Sequence[dict | Problem], dataset: str = "toyworld") -> list[Problem]:
    """Problems from dicts with ``id``, ``problem``, ``answer`` (e.g. the toy-world splits); the
    dataset name picks the grading profile (``toyworld``: a ``\\boxed{}`` integer)."""
    return [r if isinstance(r, Problem) else Problem(str(r["id"]), r["problem"], str(r["answer"]), dataset)
            for r in rows]


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def batched_records(methods: Sequence[Method], problems: Sequence[Problem], tokenizer: Any, *,
                    batch_size: int = 32, instruction: str = "", chat_template: bool = True,
                    save_traces: bool = False, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every method on every problem, ``batch_size`` rows per ``generate`` call; one record each.

    ``instruction`` is appended to every problem (the toy pair takes none; benchmarks use
    :data:`~.data.DEFAULT_INSTRUCTION`). Speculative decoding runs one problem per call (transformers
    refuses it for larger batches). Records are in ``methods`` x ``problems`` order.
    """
    if not methods or not problems:
        return []
    device = next(methods[0].llm.parameters()).device
    pad, eos = _pad_id(tokenizer), eos_ids(methods[0].llm, methods[0].slm)
    prompts = [prompt_ids(tokenizer, p.problem, instruction, chat_template) for p in problems]
    records: list[dict[str, Any]] = []
    for method in methods:
        size = 1 if method.one_row else batch_size  # speculative decoding: one row per call
        for start in range(0, len(problems), size):
            chunk = range(start, min(start + size, len(problems)))
            ids, mask = left_pad([prompts[i] for i in chunk], pad)
            synchronize(device)
            t0 = time.perf_counter()
            rows = method.run_batch(ids.to(device), mask.to(device), pad_token_id=pad)
            synchronize(device)
            seconds = time.perf_counter() - t0
            for i, (new_ids, counts) in zip(chunk, rows):
                rec = make_record(problems[i], method, tokenizer, len(prompts[i]), new_ids, counts, seconds, eos,
                                  method.settings.max_new_tokens, save_traces)
                records.append({**rec, "batch_size": len(chunk)})
            if log:
                log(f"{method.name}: {chunk.stop}/{len(problems)} ({seconds:.1f} s)")
    return records


def llm_alone_ms(latency: Any, prompt_len: int, n_tokens: int) -> float:
    """Predicted latency of the LLM writing ``n_tokens`` after a ``prompt_len`` prompt: a prefill, then decode steps."""
    calls = [{"role": "llm", "n_inf": prompt_len, "n_kv": 0}]
    calls += [{"role": "llm", "n_inf": 1, "n_kv": prompt_len + i} for i in range(n_tokens - 1)]
    return latency.predict_trace({"calls": calls, "roles": ["llm"] * n_tokens})


def summarize(records: Sequence[dict[str, Any]], latency_model: Any = None) -> list[dict[str, Any]]:
    """One row per method: accuracy, mean tokens per model, switches, LLM-token share, wall seconds
    of its batches, and -- given a :class:`~hf_rstitch.latency.LatencyModel` -- the mean estimated latency
    ``latency_ms`` (paper Eq. 4) of stitched methods whose records hold traces, and of the LLM alone from
    each row's prompt and answer lengths (:func:`llm_alone_ms`)."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    rows = []
    for name, recs in by_method.items():
        new = sum(r["new_tokens"] for r in recs)
        row = {"method": name, "kind": recs[0]["kind"], "param": recs[0]["param"], "n": len(recs),
               "accuracy": statistics.fmean(bool(r["correct"]) for r in recs),
               **{k: statistics.fmean(r[k] for r in recs) for k in ("new_tokens", "llm_tokens", "slm_tokens",
                                                                     "switches")},
               "llm_token_share": sum(r["llm_tokens"] for r in recs) / max(new, 1),
               "wall_s": sum(r["latency_s"] / r.get("batch_size", 1) for r in recs)}
        calls = [r.get("counts", {}).get("llm_forward_calls") for r in recs]
        if all(c is not None for c in calls):  # stitched methods: LLM forwards (fewer than its tokens with speculation)
            row["llm_forward_calls"] = statistics.fmean(calls)
        traced = [r["trace"] for r in recs if "trace" in r]
        if latency_model is not None and traced:  # stitched methods (the others record no trace)
            row["latency_ms"] = statistics.fmean(latency_model.predict_trace(t) for t in traced)
        elif latency_model is not None and row["kind"] == "llm":
            row["latency_ms"] = statistics.fmean(llm_alone_ms(latency_model, r["prompt_tokens"], r["new_tokens"])
                                                 for r in recs)
        rows.append(row)
    return rows


def sweep(llm: Any, slm: Any, tokenizer: Any, problems: Sequence[Problem | dict], thresholds: Sequence[float] = (),
          *, methods: Sequence[str | Method] = ("rstitch",), settings: GenSettings | None = None,
          batch_size: int = 32, instruction: str = "", chat_template: bool = True, latency_model: Any = None,
          random_p: Sequence[float] = (), router: Any = None, router_threshold: float | None = None,
          log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Accuracy and token shares of each method (``rstitch`` once per threshold) on ``problems``.

    ``methods`` are kind names (``llm``, ``slm``, ``rstitch``, ``random``, ``router``; see
    :data:`~.methods.METHODS`) or ready :class:`~.methods.Method` objects. ``settings`` defaults to
    greedy decoding with 400 new tokens. Returns :func:`summarize`'s rows, in method order.
    """
    settings = settings or GenSettings(max_new_tokens=400)
    kinds = [m for m in methods if isinstance(m, str)]
    built = build_methods(kinds, llm, slm, settings, thresholds=list(thresholds), random_p=list(random_p),
                          router=router, router_threshold=router_threshold) if kinds else []
    chosen = [m for m in methods if isinstance(m, Method)] + built
    records = batched_records(chosen, as_problems(problems), tokenizer, batch_size=batch_size,
                              instruction=instruction, chat_template=chat_template,
                              save_traces=latency_model is not None, log=log)
    return summarize(records, latency_model)
