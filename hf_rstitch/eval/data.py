"""Benchmark problems and prompts.

A benchmark is a set of rows with a ``problem`` and an ``answer`` (and an ``id``; without one, the
row's position is its id) -- the format of the six sets in ``shared/benchmarks`` and of the shipped
pair's test split. Sources:

* a JSONL file, or a ``.json`` file holding an array of rows (or JSON Lines) (read here, line numbers in errors);
* a local ``.csv`` / ``.parquet`` file, or a Hugging Face Hub dataset
  ``owner/name[:split]`` or ``owner/name:config:split`` (default split ``test``), read through
  ``datasets`` (the ``eval`` extra), imported only then.

Published layouts are recognised by their columns, wherever the rows come from (:data:`LAYOUTS`):
GSM8K's ``question`` / ``answer`` (the answer cut after ``####``) and MATH-500's ``problem`` /
``answer`` / ``unique_id`` (the id). Other columns are mapped with
``columns={"problem": "question", "answer": "final_answer"}``
(``--columns problem=question,answer=final_answer``), on top of a recognised layout. Prompts go through the tokenizer's
chat template: one user turn holding the problem followed by the instruction. This module never
grades or generates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

REQUIRED_KEYS = ("problem", "answer")  # plus "id", optional
FIELDS = ("id", "problem", "answer")
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DATASETS_FILES = {".csv": "csv", ".parquet": "parquet"}  # local files read through `datasets`


@dataclass(frozen=True)
class DataSpec:
    """How a published set maps onto ``id`` / ``problem`` / ``answer``."""

    columns: Mapping[str, str]
    config: str | None = None  # the `datasets` configuration name, if the set needs one
    answer_after: str | None = None  # keep only the text after this marker (GSM8K: "####")


@dataclass(frozen=True)
class Layout:
    """A published layout, recognised by its columns wherever the rows come from (Hub, JSONL, csv...)."""

    name: str
    has: frozenset  # columns every row of this layout has
    lacks: frozenset  # columns it never has (so id/problem/answer files are left alone)
    spec: DataSpec


LAYOUTS = (
    # openai/gsm8k: {"question", "answer": "<reasoning>\n#### 72"}
    Layout("GSM8K", frozenset({"question", "answer"}), frozenset({"problem"}),
           DataSpec({"problem": "question"}, answer_after="####")),
    # HuggingFaceH4/MATH-500: {"problem", "solution", "answer", "subject", "level", "unique_id"}
    Layout("MATH-500", frozenset({"problem", "answer", "unique_id"}), frozenset({"id"}),
           DataSpec({"id": "unique_id"})),
)

# Hub datasets that need a `datasets` configuration name to load; their columns are recognised by LAYOUTS.
HUB_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}


def detect_layout(columns: Iterable[str]) -> Layout | None:
    """The published layout whose columns these are, or None (then id/problem/answer, or --columns)."""
    names = set(columns)
    return next((lay for lay in LAYOUTS if lay.has <= names and not lay.lacks & names), None)


def spec_for(columns: Iterable[str], user: Mapping[str, str] | None = None) -> DataSpec:
    """The column mapping for rows with these ``columns``: a recognised layout's, then the user's on top."""
    layout = detect_layout(columns)
    base = layout.spec if layout is not None else DataSpec({})
    return DataSpec({**base.columns, **(user or {})}, answer_after=base.answer_after)


@dataclass(frozen=True)
class Problem:
    """One benchmark row."""

    id: str
    problem: str
    answer: str
    dataset: str


def parse_columns(text: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"problem=question,answer=final_answer"`` (or a dict) -> ``{"problem": "question", ...}``."""
    if not text:
        return {}
    pairs = dict(text) if isinstance(text, Mapping) else {}
    if not isinstance(text, Mapping):
        for item in text.split(","):
            field_, sep, column = (x.strip() for x in item.partition("="))
            if not sep or not field_ or not column:
                raise ValueError(f"--columns takes FIELD=COLUMN pairs separated by commas, e.g. "
                                 f"problem=question,answer=final_answer; got {text!r}.")
            pairs[field_] = column
    unknown = sorted(set(pairs) - set(FIELDS))
    if unknown:
        raise ValueError(f"--columns maps unknown field(s) {unknown}; the fields are {list(FIELDS)}.")
    return pairs


def dataset_name(source: str) -> str:
    """Short name of a source: the file stem (``aime24``) or the Hub id's last part."""
    path = Path(source)
    if path.suffix in (".jsonl", *DATASETS_FILES) or path.exists():
        return path.stem
    return source.split(":")[0].rstrip("/").split("/")[-1]


def _row_to_problem(obj: Any, where: str, dataset: str, columns: Mapping[str, str] | None = None,
                    index: int = 0, answer_after: str | None = None) -> Problem:
    columns = {f: (columns or {}).get(f, f) for f in FIELDS}
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with keys {list(REQUIRED_KEYS)}, got {type(obj).__name__}.")
    missing = [columns[k] for k in REQUIRED_KEYS if columns[k] not in obj]
    if missing:
        known = "; ".join(f"{lay.name}: {sorted(lay.has)}" for lay in LAYOUTS)
        raise ValueError(
            f"{where}: missing key(s) {missing}; every row needs a problem and an answer (found {sorted(obj)}). "
            "Map your columns with --columns, e.g. --columns problem=question,answer=final_answer "
            f"(published layouts are recognised by their columns: {known})."
        )
    answer = str(obj[columns["answer"]])
    if answer_after and answer_after in answer:
        answer = answer.split(answer_after)[-1].strip()
    ident = obj[columns["id"]] if columns["id"] in obj else index
    return Problem(str(ident), str(obj[columns["problem"]]), answer, dataset)


def _problems(rows: Iterable[tuple[str, int, Any]], name: str, limit: int | None, columns=None) -> list[Problem]:
    """Rows ``(where, index, obj)`` -> problems with unique ids, the first ``limit`` only. The first row's
    columns pick the layout (:func:`spec_for`); ``columns`` (the user's mapping) goes on top."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    spec = None
    for where, index, obj in rows:
        if spec is None:
            spec = spec_for(obj if isinstance(obj, dict) else (), columns)
        prob = _row_to_problem(obj, where, name, spec.columns, index, spec.answer_after)
        if prob.id in seen:
            raise ValueError(f"{where}: duplicate id {prob.id!r} (first at {seen[prob.id]}); ids must be unique.")
        seen[prob.id] = where
        problems.append(prob)
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise ValueError(f"{name} holds no rows.")
    return problems


def _jsonl_rows(path: Path):
    with path.open(encoding="utf-8") as fh:
        index = 0
        for lineno, line in _lines(fh, path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg} at column {err.colno}).") from None
            yield f"{path}:{lineno}", index, obj
            index += 1


def _json_rows(path: Path):
    """Rows of a ``.json`` file: an array of objects, an object holding one such array (``{"data": [...]}``), or
    JSON Lines; a syntax error names the line."""
    with path.open(encoding="utf-8") as fh:
        text = "".join(line for _, line in _lines(fh, path))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        first = next((line for line in text.splitlines() if line.strip()), "")
        if err.msg == "Extra data" or _is_object(first):  # JSON Lines in a .json file: line by line
            yield from _jsonl_rows(path)
            return
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno}); expected an array "
                         f"of objects with {list(REQUIRED_KEYS)} (or one object per line, JSONL).") from None
    if isinstance(doc, dict):
        arrays = [v for v in doc.values() if isinstance(v, list)]
        doc = arrays[0] if len(arrays) == 1 else [doc]
    if not isinstance(doc, list):
        raise ValueError(f"{path}: holds a JSON {type(doc).__name__}; expected an array of objects with "
                         f"{list(REQUIRED_KEYS)}.")
    for index, obj in enumerate(doc):
        yield f"{path} row {index}", index, obj


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _lines(fh, path: Path):
    """``(line number, line)`` of a text file, with a message naming the file if it is not UTF-8 text."""
    lineno = 0
    try:
        for lineno, line in enumerate(fh, start=1):
            yield lineno, line
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}:{lineno + 1}: not UTF-8 text ({err.reason} at byte {err.start}); expected a JSONL "
                         f"file with {list(FIELDS)} per line.") from None


def check_readable(path: Path, what: str = "benchmark file") -> None:
    """Raise ``FileNotFoundError`` / ``IsADirectoryError`` naming ``path`` unless it is a file."""
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; pass the file itself.")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist; pass a .jsonl file with {list(FIELDS)} per line.")


def load_jsonl(path: str | Path, limit: int | None = None, dataset: str | None = None,
               columns: Mapping[str, str] | None = None) -> list[Problem]:
    """Read a benchmark JSONL file (blank lines skipped); ``limit`` keeps the first N rows."""
    path = Path(path)
    check_readable(path)
    return _problems(_jsonl_rows(path), dataset or path.stem, limit, columns)


def load_json(path: str | Path, limit: int | None = None, columns: Mapping[str, str] | None = None) -> list[Problem]:
    """Read a benchmark ``.json`` file (:func:`_json_rows`); ``limit`` keeps the first N rows."""
    path = Path(path)
    check_readable(path)
    return _problems(_json_rows(path), path.stem, limit, columns)


def _import_datasets(source: str):
    try:
        import datasets
    except ImportError as err:
        raise ImportError(f"reading {source!r} needs the `datasets` package: pip install datasets "
                          "(or hf-rstitch's eval extra).") from err
    return datasets


def load_with_datasets(source: str, limit: int | None = None, columns: Mapping[str, str] | None = None) -> list[Problem]:
    """Rows of a local .json/.csv/.parquet file or a Hub dataset ``owner/name[:config]:split`` (default split test)."""
    datasets = _import_datasets(source)
    path = Path(source)
    if path.suffix in DATASETS_FILES:
        check_readable(path)
        loader = dict(path=DATASETS_FILES[path.suffix], data_files=str(path), split="train")
    else:
        parts = source.split(":")
        if len(parts) > 3 or not parts[0]:
            raise ValueError(f"Hub dataset {source!r}: expected owner/name, owner/name:split or owner/name:config:split.")
        repo = parts[0]
        config = parts[1] if len(parts) == 3 else HUB_CONFIGS.get(repo)
        loader = dict(path=repo, name=config, split=parts[-1] if len(parts) > 1 else "test")
    try:
        ds = datasets.load_dataset(**loader)
    except Exception as err:  # the Hub / datasets raise many types; say what was asked and what failed
        cause = " ".join(f"{type(err).__name__}: {err}".split())
        if path.suffix in DATASETS_FILES:
            raise ValueError(f"{source}: could not read it as {DATASETS_FILES[path.suffix]} ({cause}); expected a "
                             f"table with {list(REQUIRED_KEYS)} columns (or JSONL: one object per line).") from None
        raise ValueError(f"could not load {source!r} with datasets.load_dataset({loader}): {cause}. Check the id, "
                         "split and config, and that the Hub is reachable (HF_HUB_OFFLINE).") from None
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    mapping = spec_for(ds.column_names, columns).columns
    missing = [c for f, c in {f: mapping.get(f, f) for f in REQUIRED_KEYS}.items() if c not in ds.column_names]
    if missing:
        raise ValueError(f"{source}: no column(s) {missing}; it has {ds.column_names}. Map them with "
                         "--columns problem=COLUMN,answer=COLUMN (and id=COLUMN).")
    rows = ((f"{source} row {i}", i, row) for i, row in enumerate(ds))
    return _problems(rows, dataset_name(source), limit, columns)


def load_hub(source: str, limit: int | None = None, columns: Mapping[str, str] | None = None) -> list[Problem]:
    """Rows of a Hub dataset ``owner/name[:split]`` (kept name; see :func:`load_with_datasets`)."""
    return load_with_datasets(source, limit, columns)


def load_problems(source: str, limit: int | None = None, columns: str | Mapping[str, str] | None = None) -> list[Problem]:
    """Problems from a JSONL file, a local .json/.csv/.parquet file or a Hub dataset; see the module docstring."""
    columns = parse_columns(columns)
    if Path(source).suffix == ".json":
        return load_json(source, limit=limit, columns=columns)
    if Path(source).suffix == ".jsonl" or (Path(source).exists() and Path(source).suffix not in DATASETS_FILES):
        return load_jsonl(source, limit=limit, columns=columns)
    return load_with_datasets(source, limit=limit, columns=columns)


def default_instruction(llm: str | None, slm: str | None) -> str:
    """The instruction when none is given: none for the shipped pair (trained without one; it boxes its answer
    anyway, and the instruction's words are unknown to it), else :data:`DEFAULT_INSTRUCTION`. ``rstitch eval`` and
    ``rstitch tune`` both use this, so the two prompt the same pair the same way."""
    from ..resources import resolve, shipped

    try:
        toy = (resolve(llm), resolve(slm)) == (str(shipped("llm")), str(shipped("slm")))
    except (ValueError, FileNotFoundError):  # no package data in this install: not the shipped pair
        toy = False
    return "" if toy else DEFAULT_INSTRUCTION


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
