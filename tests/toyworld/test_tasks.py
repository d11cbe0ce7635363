"""Generator: determinism, disjoint splits, answers correct by construction."""

import re

import pytest

from hf_rstitch.toyworld import tasks
from hf_rstitch.toyworld.pair import ASSETS, extract_boxed

_EQUATION = re.compile(r"(?<![\d] )((?:\d+ [-+*/] )+\d+) = (\d+)(?: rest (\d+))?")
_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def _solve_text(problem: str) -> int:
    """Independent solver that reads the English problem, not the structured program."""
    sentences = [s.strip() for s in problem.split(".") if s.strip()]
    x = int(re.search(r"has (\d+)", sentences[0]).group(1))
    for s in sentences[1:]:
        if m := re.search(r"(?:gets|finds) (\d+) more", s):
            x += int(m.group(1))
        elif m := re.search(r"(?:gives away|loses) (\d+)", s):
            x -= int(m.group(1))
        elif m := re.search(r"becomes (\w+) times", s):
            x *= _WORDS[m.group(1)]
        elif m := re.search(r"into (\d+) equal groups", s):
            assert x % int(m.group(1)) == 0
            x //= int(m.group(1))
    return x


def test_same_seed_same_rows_other_seed_other_rows():
    a = tasks.make_split("train", 50, seed=3, style_mix={"concise": 0.5, "verbose": 0.5})
    b = tasks.make_split("train", 50, seed=3, style_mix={"concise": 0.5, "verbose": 0.5})
    c = tasks.make_split("train", 50, seed=4, style_mix={"concise": 0.5, "verbose": 0.5})
    assert a == b
    assert a != c
    assert {r["style"] for r in a} == {"concise", "verbose"}


def test_splits_never_overlap():
    keys = {split: {tasks.program_of(r).canonical() for r in tasks.make_split(split, n, seed=0)}
            for split, n in (("train", 3000), ("valid", 200), ("test", 600))}
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["valid"]
    assert not keys["valid"] & keys["test"]
    # The split is a function of the arithmetic alone, whatever the seed or names.
    for row in tasks.make_split("train", 200, seed=7):
        assert tasks.split_of(tasks.program_of(row)) == "train"


@pytest.mark.parametrize("style", tasks.STYLES)
def test_answers_correct_by_construction(style):
    for row in tasks.make_split("test", 300, seed=0, style=style):
        program = tasks.program_of(row)
        assert len(program.ops) == row["level"] + 1
        assert _solve_text(row["problem"]) == program.answer == int(row["answer"])
        assert all(1 <= v <= tasks.MAX_VALUE for v in program.values())
        assert row["reasoning"].endswith(f"\\boxed{{{row['answer']}}}")
        assert extract_boxed(row["reasoning"]) == row["answer"]
        # Every written equation ("a op b [op c] = r", "a / b = q rest r") is true arithmetic.
        for expr, result, rest in _EQUATION.findall(row["reasoning"]):
            if "/" in expr:
                a, b = map(int, expr.split(" / "))
                assert divmod(a, b) == (int(result), int(rest or 0))
            else:
                assert eval(expr) == int(result)  # digits and + - * only


def test_verbose_is_much_longer_than_concise():
    program = tasks.Program(start=147, ops=(("+", 36), ("-", 28), ("*", 3)))
    concise, verbose = tasks.reason_concise(program), tasks.reason_verbose(program)
    assert concise == ("So: 147 + 36 = 183. 183 - 28 = 155. 155 * 3 = 465. "
                       "The answer is \\boxed{465}")
    assert "borrow" in verbose and "carry" in verbose and "Check: 465 / 3 = 155. Correct." in verbose
    assert len(concise) < 0.3 * len(verbose)


def test_column_arithmetic_hand_values():
    assert tasks._column_add(95, 7) == "5 + 7 = 12, carry 1; 9 + 0 + 1 = 10, carry 1; carry 1 gives 1"
    assert tasks._column_sub(83, 28) == "3 is less than 8, borrow, 13 - 8 = 5; 8 - 1 - 2 = 5"
    assert tasks._long_div(112, 8) == "1 / 8 = 0 rest 1; 11 / 8 = 1 rest 3; 32 / 8 = 4 rest 0"


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="split must be one of"):
        next(tasks.iter_rows("dev", 0))
    with pytest.raises(ValueError, match="style must be one of"):
        tasks.reason(tasks.Program(1, ()), "terse")


@pytest.mark.skipif(not (ASSETS / "test.jsonl").exists(), reason="shipped test split absent")
def test_shipped_test_split_is_regenerated_by_seed():
    shipped = tasks.read_jsonl(ASSETS / "test.jsonl")
    assert len(shipped) >= 500
    assert shipped == tasks.make_split("test", len(shipped), seed=0, style="verbose")
