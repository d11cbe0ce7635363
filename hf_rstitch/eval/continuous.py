"""Evaluation through continuous batching: ``rstitch eval --batch-size N`` with N > 1.

Each method runs as one :class:`~hf_rstitch.batching.RequestEngine` over all its problems: up to N
problems decode together, and a problem that finishes hands its row to the next one at once.
Greedy outputs equal the batch-size-1 harness's (each request equals its solo ``generate``), so
accuracy and token counts are those of :mod:`.runner`; ``latency_s`` is the request's own wall
time in the batch (from the step that admitted it to the step that finished it), and every record
says the ``batch_size`` it shared. Methods the engine cannot run (speculative decoding:
transformers' assisted generation is batch size 1 only) stay with :func:`.runner.run_eval`.
Records go to the same resumable store, one per (dataset, problem, method), as they finish.
"""

from __future__ import annotations

import time
from typing import Any

from .data import Problem, prompt_ids
from .methods import Method, eos_ids
from .runner import RecordStore, _progress, make_record, tick


def engine_methods(methods: list[Method]) -> tuple[list[Method], list[Method]]:
    """(methods the request engine runs, methods left to the batch-size-1 harness)."""
    runs = [m.engine_spec() is not None for m in methods]
    return [m for m, r in zip(methods, runs) if r], [m for m, r in zip(methods, runs) if not r]


def longest_request(problems: list[Problem], tokenizer: Any, instruction: str, chat_template: bool,
                    max_new_tokens: int) -> int:
    """The longest prompt of ``problems`` (as :func:`run_continuous` prompts them) plus ``max_new_tokens``: the
    length the engine's lanes are built for."""
    return max((len(prompt_ids(tokenizer, p.problem, instruction, chat_template)) for p in problems),
               default=1) + max_new_tokens


def run_continuous(methods: list[Method], problems: list[Problem], tokenizer: Any, store: RecordStore, *,
                   batch_size: int, schedule: str = "now", engine=None, instruction: str = "",
                   chat_template: bool = True, progress: bool = True, save_traces: bool = False) -> list[dict[str, Any]]:
    """Every engine-capable method on every problem not already in ``store``; the new records.

    ``engine``: the pair's built engine (:func:`hf_rstitch.engine.build`; ``rstitch eval`` builds it once, so one
    engine serves every method: lanes and graphs built once, and with ``--warmup`` captured before the first timed
    request); None: one built here, ``"auto"`` as everywhere else."""
    from hf_rstitch.batching import RequestEngine

    done = store.done()
    todo = {m.name: [p for p in problems if (p.dataset, p.id, m.name) not in done] for m in methods}
    if (total := sum(len(v) for v in todo.values())) == 0:
        return []
    prompts = {(p.dataset, p.id): prompt_ids(tokenizer, p.problem, instruction, chat_template) for p in problems}
    records: list[dict[str, Any]] = []
    if engine is None:
        longest = max(len(ids) for ids in prompts.values()) + max(m.settings.max_new_tokens for m in methods)
        engine = _auto_engine(methods[0], batch_size, longest, schedule)
    with _progress(total, progress) as bar:
        for method in methods:
            if not todo[method.name]:
                continue
            spec, s, eos = method.engine_spec(), method.settings, eos_ids(method.llm, method.slm)
            requests = RequestEngine(engine, policy=spec.get("policy"), schedule=schedule)
            for i, p in enumerate(todo[method.name]):
                requests.submit(_request(prompts[(p.dataset, p.id)], s, eos, str(i), spec.get("role")))
            for rec in _drain(requests, method, todo[method.name], prompts, tokenizer, eos, batch_size, save_traces):
                store.append(rec)
                records.append(rec)
                tick(bar, rec, f"B={batch_size}")
    return records


def _auto_engine(method: Method, batch_size: int, longest: int, schedule: str):
    """``"auto"``'s engine for ``method``'s pair: ``batch_size`` rows of ``longest`` tokens."""
    from hf_rstitch.engine import EngineConfig, Pair, build

    cfg = EngineConfig(max_batch=batch_size, max_length=longest, kv_memory=None, fast_like_auto=True)
    return build(Pair.of(method.llm, method.slm), cfg.for_requests(schedule))


def _request(prompt: list[int], s, eos: set[int], request_id: str, role):
    """One problem as a :class:`~hf_rstitch.batching.Request` with a method's generation settings ``s``."""
    from hf_rstitch.batching import Request

    return Request(prompt, max_new_tokens=s.max_new_tokens, eos_token_id=sorted(eos), do_sample=s.do_sample,
                   temperature=s.temperature, top_p=s.top_p, seed=s.seed if s.do_sample else None,
                   request_id=request_id, role=role)


def _drain(engine, method: Method, problems: list[Problem], prompts: dict, tokenizer: Any, eos: set[int], batch_size: int,
           save_traces: bool):
    """Step ``engine`` until empty, yielding one record per finished request."""
    started: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    while engine.has_work():
        t0 = time.perf_counter()
        events = engine.step()  # ends with a host copy of the step's tokens: the device is done
        t1 = time.perf_counter()
        for e in events:
            started.setdefault(e.request_id, t0)
            if e.token is not None:
                tokens.setdefault(e.request_id, []).append(e.token)
            if not e.finished:
                continue
            p = problems[int(e.request_id)]
            counts = {**e.trace.summary(), "_trace": e.trace}
            new = tokens.pop(e.request_id, [])
            rec = make_record(p, method, tokenizer, len(prompts[(p.dataset, p.id)]), new, counts,
                              t1 - started.pop(e.request_id), eos, method.settings.max_new_tokens, save_traces)
            yield {**rec, "batch_size": batch_size}
