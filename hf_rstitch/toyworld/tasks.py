"""Toy world: multi-step arithmetic word problems with chain-of-thought, in two styles.

A problem is a :class:`Program`: a start value and 2-4 operations (add, subtract, multiply by a
digit, divide by a digit). It is rendered as an English word problem and solved in one of two
reasoning styles that mirror the paper's pair:

* ``concise`` (the SLM's style, like L1-Short): one line per step, each result written in one
  shot (``147 + 36 = 183.``). A small model has to do the carries "in its head" and errs there.
* ``verbose`` (the LLM's style, like R1-Distill): each step spelled out digit by digit from the
  ones column up, with carries and borrows, then re-checked by the inverse operation.

Both end with ``\\boxed{N}``. The split between train / valid / test is decided by a hash of
the problem's canonical form (the numbers and operations, not the names and objects), so a test
problem's arithmetic never appears in training under other words.

This module is pure Python: no torch, no tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from typing import Iterator

STYLES = ("concise", "verbose")
SPLITS = ("train", "valid", "test")
LEVELS = (1, 2, 3)
# Share of hash buckets (out of 100) given to each held-out split; the rest is train.
_TEST_BUCKETS = range(0, 5)
_VALID_BUCKETS = range(5, 7)
MAX_VALUE = 999

_NAMES = ["Tom", "Ann", "Sam", "Lily", "Ben", "Mia", "Leo", "Zoe", "Max", "Eva", "Dan", "Ivy"]
_ITEMS = ["apples", "coins", "books", "stamps", "marbles", "cards", "shells", "pens", "beads",
          "stickers"]
_DIGIT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight",
                9: "nine"}


@dataclasses.dataclass(frozen=True)
class Program:
    """The structured problem: ``start`` then each ``(op, operand)`` applied in order."""

    start: int
    ops: tuple[tuple[str, int], ...]

    def values(self) -> list[int]:
        """Running values: ``[start, after op 1, ..., after op n]``."""
        out = [self.start]
        for op, b in self.ops:
            out.append(apply_op(out[-1], op, b))
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def canonical(self) -> str:
        return f"{self.start}" + "".join(f" {op}{b}" for op, b in self.ops)


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if a % b:
            raise ValueError(f"{a} / {b} is not exact; the generator only makes exact divisions")
        return a // b
    raise ValueError(f"unknown op {op!r}; expected one of + - * /")


def split_of(program: Program) -> str:
    """``train`` / ``valid`` / ``test``, from a hash of the canonical form (names excluded)."""
    bucket = int(hashlib.sha1(program.canonical().encode()).hexdigest()[:8], 16) % 100
    if bucket in _TEST_BUCKETS:
        return "test"
    if bucket in _VALID_BUCKETS:
        return "valid"
    return "train"


# --------------------------------------------------------------------------- sampling programs

def _level_ranges(level: int) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """(number of ops, start range, add/sub operand range) for a difficulty level."""
    return {1: (2, (10, 99), (2, 60)), 2: (3, (10, 199), (10, 99)),
            3: (4, (50, 499), (10, 199))}[level]


def sample_program(rng: random.Random, level: int) -> Program:
    """Draw a program whose every running value stays in ``[1, MAX_VALUE]``."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level}")
    n_ops, start_range, operand_range = _level_ranges(level)
    while True:
        start = x = rng.randint(*start_range)
        ops: list[tuple[str, int]] = []
        for _ in range(n_ops):
            op = _sample_op(rng, x, operand_range, level)
            if op is None:
                break
            ops.append(op)
            x = apply_op(x, *op)
        if len(ops) == n_ops:
            return Program(start=start, ops=tuple(ops))


def _sample_op(rng: random.Random, x: int, operand_range: tuple[int, int],
               level: int) -> tuple[str, int] | None:
    choices = ["+", "-", "*"] + (["/"] if level >= 2 else [])
    for _ in range(20):
        op = rng.choice(choices)
        if op in "+-":
            b = rng.randint(*operand_range)
        else:
            b = rng.randint(2, 9)
        if op == "-" and b >= x:
            continue
        if op == "/" and x % b:
            continue
        if op == "*" and x * b > MAX_VALUE:
            continue
        if op == "+" and x + b > MAX_VALUE:
            continue
        return op, b
    return None


# --------------------------------------------------------------------------- rendering problems

def render_problem(program: Program, rng: random.Random) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    parts = [f"{name} has {program.start} {item}."]
    for op, b in program.ops:
        if op == "+":
            parts.append(rng.choice([f"{name} gets {b} more {item}.",
                                     f"Then {name} finds {b} more."]))
        elif op == "-":
            parts.append(rng.choice([f"{name} gives away {b} {item}.",
                                     f"Then {name} loses {b} of them."]))
        elif op == "*":
            parts.append(f"Then the number of {item} becomes {_DIGIT_WORDS[b]} times as large.")
        else:
            parts.append(f"{name} splits them into {b} equal groups and keeps one group.")
    parts.append(f"How many {item} does {name} have now?")
    return " ".join(parts)


# --------------------------------------------------------------------------- reasoning styles

def _digits(n: int, width: int) -> list[int]:
    """Digits of ``n``, ones first, padded to ``width``."""
    return [(n // 10 ** i) % 10 for i in range(width)]


def _column_add(a: int, b: int) -> str:
    width = len(str(max(a, b)))
    da, db, carry, out = _digits(a, width), _digits(b, width), 0, []
    for i in range(width):
        s = da[i] + db[i] + carry
        expr = f"{da[i]} + {db[i]}" + (f" + {carry}" if carry else "")
        carry = s // 10
        out.append(f"{expr} = {s}" + (", carry 1" if carry else ""))
    if carry:
        out.append("carry 1 gives 1")
    return "; ".join(out)


def _column_sub(a: int, b: int) -> str:
    width = len(str(a))
    da, db, borrow, out = _digits(a, width), _digits(b, width), 0, []
    for i in range(width):
        top = da[i] - borrow
        top_txt = f"{da[i]} - 1" if borrow else f"{da[i]}"
        if top < db[i]:
            out.append(f"{top_txt} is less than {db[i]}, borrow, {top + 10} - {db[i]} = "
                       f"{top + 10 - db[i]}")
            borrow = 1
        else:
            out.append(f"{top_txt} - {db[i]} = {top - db[i]}")
            borrow = 0
    return "; ".join(out)


def _column_mul(a: int, k: int) -> str:
    width = len(str(a))
    da, carry, out = _digits(a, width), 0, []
    for i in range(width):
        p = da[i] * k + carry
        expr = f"{da[i]} * {k}" + (f" + {carry}" if carry else "")
        carry = p // 10
        out.append(f"{expr} = {p}" + (f", carry {carry}" if carry else ""))
    if carry:
        out.append(f"carry {carry} gives {carry}")
    return "; ".join(out)


def _long_div(a: int, k: int) -> str:
    out, rem = [], 0
    for d in str(a):
        cur = rem * 10 + int(d)
        q, rem = divmod(cur, k)
        out.append(f"{cur} / {k} = {q} rest {rem}")
    return "; ".join(out)


_COLUMN = {"+": _column_add, "-": _column_sub, "*": _column_mul, "/": _long_div}
_INVERSE = {"+": "-", "-": "+", "*": "/", "/": "*"}


def reason_concise(program: Program) -> str:
    values = program.values()
    lines = ["So:"]
    for (op, b), x, y in zip(program.ops, values, values[1:]):
        lines.append(f"{x} {op} {b} = {y}.")
    lines.append(f"The answer is \\boxed{{{values[-1]}}}")
    return " ".join(lines)


def reason_verbose(program: Program) -> str:
    values = program.values()
    lines = [f"Let me work step by step. Start with {values[0]}."]
    for i, ((op, b), x, y) in enumerate(zip(program.ops, values, values[1:]), start=1):
        lines.append(f"Step {i}: {x} {op} {b}. {_COLUMN[op](x, b)}. So {x} {op} {b} = {y}.")
        lines.append(f"Check: {y} {_INVERSE[op]} {b} = {x}. Correct.")
    lines.append(f"The answer is \\boxed{{{values[-1]}}}")
    return " ".join(lines)


def opening_word(style: str) -> str:
    """The word every answer in ``style`` starts with (``"So"`` / ``"Let"``)."""
    return reason(Program(1, (("+", 1),)), style).split()[0].rstrip(":")


def reason(program: Program, style: str) -> str:
    if style == "concise":
        return reason_concise(program)
    if style == "verbose":
        return reason_verbose(program)
    raise ValueError(f"style must be one of {STYLES}, got {style!r}")


# --------------------------------------------------------------------------- datasets

def iter_rows(split: str, seed: int, style: str | None = None,
              style_mix: dict[str, float] | None = None) -> Iterator[dict]:
    """Endless, deterministic stream of rows of ``split``.

    Args:
        split: ``train``, ``valid`` or ``test``; rows of the other splits are skipped.
        seed: the stream's seed; the same seed gives the same rows in the same order.
        style: fixed reasoning style, or ``None`` to draw one per row from ``style_mix``.
        style_mix: ``{"verbose": 0.8, "concise": 0.2}``; default is concise only.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"toyworld:{split}:{seed}")
    mix = style_mix or {"concise": 1.0}
    styles, weights = zip(*sorted(mix.items()))
    i = 0
    while True:
        level = LEVELS[i % len(LEVELS)]
        program = sample_program(rng, level)
        problem = render_problem(program, rng)
        row_style = style or rng.choices(styles, weights)[0]
        if split_of(program) != split:
            continue
        yield {
            "id": f"toy-{split}-{seed}-{i}",
            "problem": problem,
            "answer": str(program.answer),
            "reasoning": reason(program, row_style),
            "style": row_style,
            "level": level,
            "program": {"start": program.start, "ops": [list(o) for o in program.ops]},
        }
        i += 1


def make_split(split: str, n: int, seed: int, style: str | None = None,
               style_mix: dict[str, float] | None = None, unique: bool = True) -> list[dict]:
    """First ``n`` rows of :func:`iter_rows`; ``unique`` drops repeated canonical forms."""
    rows, seen = [], set()
    for row in iter_rows(split, seed, style, style_mix):
        key = program_of(row).canonical()
        if unique and key in seen:
            continue
        seen.add(key)
        rows.append(row)
        if len(rows) == n:
            return rows
    raise AssertionError("unreachable")  # pragma: no cover


def example_row(seed: int = 0) -> dict:
    """A held-out problem of the toy world, the shipped pair's own kind of question: the first row of the
    test split at ``seed``. ``rstitch generate`` asks it when given no ``--prompt``."""
    return make_split("test", 1, seed)[0]


def program_of(row: dict) -> Program:
    p = row["program"]
    return Program(start=int(p["start"]), ops=tuple((op, int(b)) for op, b in p["ops"]))


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
