"""Benchmark problems and prompts.

A benchmark is a JSONL file with one object per line carrying at least ``id``, ``problem`` and
``answer`` (strings; extra keys are ignored) -- the format of the six sets in
``shared/benchmarks`` and of the shipped pair's test split. A source that is not an existing
file is read as a Hugging Face Hub dataset id (``owner/name`` or ``owner/name:split``) through
``datasets``, imported only then; Hub rows need the same three columns.

Prompts go through the tokenizer's chat template: one user turn holding the problem followed
by the instruction. This module never grades or generates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED_KEYS = ("id", "problem", "answer")
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Problem:
    """One benchmark row."""

    id: str
    problem: str
    answer: str
    dataset: str


def dataset_name(source: str) -> str:
    """Short name of a source: the file stem (``aime24``) or the Hub id's last part."""
    path = Path(source)
    if path.suffix == ".jsonl" or path.exists():
        return path.stem
    return source.split(":")[0].rstrip("/").split("/")[-1]


def _row_to_problem(obj: Any, where: str, dataset: str) -> Problem:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with keys {REQUIRED_KEYS}, got {type(obj).__name__}.")
    missing = [k for k in REQUIRED_KEYS if k not in obj]
    if missing:
        raise ValueError(
            f"{where}: missing key(s) {missing}; every row needs {REQUIRED_KEYS} "
            f"(found {sorted(obj)}). Rename your columns, e.g. question -> problem, final_answer -> answer."
        )
    return Problem(str(obj["id"]), str(obj["problem"]), str(obj["answer"]), dataset)


def load_jsonl(path: str | Path, limit: int | None = None, dataset: str | None = None) -> list[Problem]:
    """Read a benchmark JSONL file (blank lines skipped); ``limit`` keeps the first N rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist; pass a .jsonl file with {REQUIRED_KEYS} per line.")
    name = dataset or path.stem
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno}).") from None
            prob = _row_to_problem(obj, where, name)
            if prob.id in seen:
                raise ValueError(f"{where}: duplicate id {prob.id!r} (first on line {seen[prob.id]}); ids must be unique.")
            seen[prob.id] = lineno
            problems.append(prob)
            if limit is not None and len(problems) >= limit:
                break
    if not problems:
        raise ValueError(f"{path} holds no rows.")
    return problems


def load_hub(source: str, limit: int | None = None) -> list[Problem]:
    """Rows of a Hub dataset ``owner/name[:split]`` (default split ``test``). Needs ``datasets``."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"{source!r} is not a file, so it was read as a Hub dataset id, which needs `pip install datasets`."
        ) from err
    repo, _, split = source.partition(":")
    ds = datasets.load_dataset(repo, split=split or "test")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    name = dataset_name(source)
    return [_row_to_problem(row, f"{source} row {i}", name) for i, row in enumerate(ds)]


def load_problems(source: str, limit: int | None = None) -> list[Problem]:
    """Problems from a JSONL file, or from the Hub when ``source`` is not an existing path."""
    if Path(source).exists() or source.endswith(".jsonl"):
        return load_jsonl(source, limit=limit)
    return load_hub(source, limit=limit)


def user_message(problem: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    return f"{problem.strip()}\n\n{instruction}" if instruction else problem.strip()


def prompt_ids(tokenizer: Any, problem: str, instruction: str = DEFAULT_INSTRUCTION,
               chat_template: bool = True) -> list[int]:
    """Token ids of the prompt for one problem (chat template with a generation prompt)."""
    text = user_message(problem, instruction)
    if not chat_template:
        return list(tokenizer(text)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template; use a chat/instruct checkpoint, set "
            "tokenizer.chat_template, or pass --no-chat-template to prompt with raw text."
        )
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)
