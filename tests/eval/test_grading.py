"""Grading on real reference answers from the six benchmark files of ``shared/benchmarks``.

Those files are not part of the repository: the slow test that reads them finds them in
``$RSTITCH_BENCHMARKS``, else in ``shared/benchmarks`` beside the checkout, and skips (saying so) otherwise.

Each case is (dataset, row id, reference answer as stored, model answer, expected). The
reference strings are copied verbatim from the files; the model answers are equivalent (or
wrong) surface forms a model might box. Evaluation data only: nothing here tunes anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("math_verify")

from hf_rstitch.eval.grading import (  # noqa: E402
    INTEGER,
    MINERVA,
    extract_answer,
    grade,
    is_equiv,
    last_boxed,
    profile_for,
)

CASES = [
    # aime24: zero-padded integers
    ("aime24", "67", "025", "25", True),
    ("aime24", "67", "025", "025", True),
    ("aime24", "75", "073", "73.0", True),
    ("aime24", "67", "025", "26", False),
    # amc23: integers
    ("amc23", "-", "-1", "-1", True),
    ("amc23", "-", "3159", "3,159", True),
    ("amc23", "-", "27", "27.5", False),
    # gsm8k: thousands separators
    ("gsm8k", "-", "2,125", "2125", True),
    ("gsm8k", "-", "1,450,000", "\\$1,450,000", True),
    ("gsm8k", "-", "1,450,000", "1450000.00", True),
    ("gsm8k", "-", "-10", "-10", True),
    ("gsm8k", "-", "2,125", "2,126", False),
    # math500: LaTeX
    ("math500", "test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True),
    ("math500", "test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", False),
    ("math500", "test/precalculus/927.json", "90^\\circ", "90", True),
    ("math500", "test/precalculus/927.json", "90^\\circ", "90^{\\circ}", True),
    ("math500", "test/precalculus/927.json", "90^\\circ", "45^\\circ", False),
    ("math500", "test/algebra/1349.json", "\\text{Evelyn}", "Evelyn", True),
    ("math500", "test/algebra/1349.json", "\\text{Evelyn}", "\\text{Navin}", False),
    ("math500", "test/algebra/2626.json", "\\$32,\\!348", "32348", True),
    ("math500", "test/algebra/2626.json", "\\$32,\\!348", "\\$32,348", True),
    ("math500", "test/algebra/2626.json", "\\$32,\\!348", "32,349", False),
    ("math500", "test/algebra/2780.json", "\\$18.90", "18.9", True),
    ("math500", "test/prealgebra/1203.json", "\\$36", "36", True),
    ("math500", "test/precalculus/819.json", "\\text{(C)}", "C", True),
    ("math500", "test/precalculus/819.json", "\\text{(C)}", "(C)", True),
    ("math500", "test/precalculus/819.json", "\\text{(C)}", "\\text{(B)}", False),
    ("math500", "test/prealgebra/1044.json", "5.4 \\text{ cents}", "5.4", True),
    ("math500", "test/prealgebra/1044.json", "5.4 \\text{ cents}", "5.35", False),
    ("math500", "test/intermediate_algebra/515.json", "\\frac43", "\\dfrac{4}{3}", True),
    ("math500", "test/intermediate_algebra/515.json", "\\frac43", "4/3", True),
    ("math500", "test/intermediate_algebra/515.json", "\\frac43", "\\frac{3}{4}", False),
    ("math500", "test/intermediate_algebra/428.json", "3, 5, 7", "7, 3, 5", True),
    ("math500", "test/intermediate_algebra/428.json", "3, 5, 7", "3, 5", False),
    ("math500", "test/intermediate_algebra/1388.json", "1,-2", "-2, 1", True),
    ("math500", "test/intermediate_algebra/558.json", "(3,4]", "(3, 4]", True),
    ("math500", "test/intermediate_algebra/558.json", "(3,4]", "(3,4)", False),
    ("math500", "test/counting_and_probability/508.json", "10,\\!080", "10080", True),
    ("math500", "test/number_theory/417.json", "11,\\! 111,\\! 111,\\! 100", "11111111100", True),
    ("math500", "test/prealgebra/1003.json", "\\frac{270}7\\text{ degrees}", "\\frac{270}{7}", True),
    ("math500", "test/geometry/473.json", "864 \\mbox{ inches}^2", "864", True),
    ("math500", "test/algebra/2193.json", "x=5", "5", True),
    ("math500", "test/intermediate_algebra/662.json", "1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", True),
    ("math500", "test/precalculus/1300.json", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
     "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\\\ \\frac53 \\end{pmatrix}", True),
    ("math500", "test/precalculus/990.json", "6 - 5i", "6-5i", True),
    ("math500", "test/precalculus/990.json", "6 - 5i", "6+5i", False),
    # minerva_math: rounded decimals, e-notation, python-ish, pairs
    ("minerva_math", "1", "4.5e33", "4.5 \\times 10^{33}", True),
    ("minerva_math", "1", "4.5e33", "4.49e33", True),
    ("minerva_math", "1", "4.5e33", "4.5e32", False),
    ("minerva_math", "44", "1e-5", "10^{-5}", True),
    ("minerva_math", "44", "1e-5", "2e-5", False),
    ("minerva_math", "38", "-1./3", "-\\frac{1}{3}", True),
    ("minerva_math", "49", "-3./2", "-1.5", True),
    ("minerva_math", "5", "np.arcsin(10/13)", "\\arcsin\\left(\\frac{10}{13}\\right)", True),
    ("minerva_math", "4", "0.006", "0.0062", True),
    ("minerva_math", "4", "0.006", "0.007", False),
    ("minerva_math", "3", "20.39", "20.4", True),
    ("minerva_math", "59", "1538", "1500", False),
    ("minerva_math", "269", "E_{1},E_{2}", "E_{2}, E_{1}", True),
    ("minerva_math", "245", "MR=SRMC", "MR = SRMC", True),
    ("minerva_math", "72", "x_{0} \\cos (\\omega t)+$ $\\dot{x}_{0} \\sin (\\omega t) / \\omega",
     "x_{0} \\cos (\\omega t)+\\dot{x}_{0} \\sin (\\omega t) / \\omega", True),
    # olympiadbench: $...$-wrapped, multi-answer sets
    ("olympiadbench", "1610", "$\\frac{1}{2 n+2}$", "\\frac{1}{2n+2}", True),
    ("olympiadbench", "1610", "$\\frac{1}{2 n+2}$", "\\frac{1}{2n+1}", False),
    ("olympiadbench", "1612", "$2^{1009}$", "2^{1009}", True),
    ("olympiadbench", "2490", "$6764$,$10945$", "10945, 6764", True),
    ("olympiadbench", "2490", "$6764$,$10945$", "6764", False),
    ("olympiadbench", "2301", "1,2,5,8,9", "9, 8, 5, 2, 1", True),
    ("olympiadbench", "2301", "1,2,5,8,9", "1, 2, 5, 8", False),
    ("olympiadbench", "2330", "(1,-4,-2),(3,2,3),(13,2,-2)", "(13,2,-2), (1,-4,-2), (3,2,3)", True),
    ("olympiadbench", "2330", "(1,-4,-2),(3,2,3),(13,2,-2)", "(13,2,-2), (1,-4,-2), (3,2,4)", False),
    ("olympiadbench", "2171", "$f(x)=x,f(x)=-x$", "f(x)=-x, f(x)=x", True),
    ("olympiadbench", "2255", "62.5%", "62.5\\%", True),
    ("olympiadbench", "2276", "$8 \\%$", "8", True),
    ("olympiadbench", "2298", "$(-\\sqrt{11},-2)\\cup (\\sqrt{11},9)$", "(-\\sqrt{11},-2) \\cup (\\sqrt{11},9)", True),
    ("olympiadbench", "2891", "$\\quad(2+\\sqrt{2}, 1+\\sqrt{2})$", "(2+\\sqrt2, 1+\\sqrt2)", True),
    ("olympiadbench", "2287", "$a=2$, $a=-6-4 \\sqrt{2}$", "-6-4\\sqrt{2}, 2", True),
    ("olympiadbench", "2435", "$18.8^{\\circ}$", "18.8", True),
    ("olympiadbench", "2435", "$18.8^{\\circ}$", "18.9", False),
]


@pytest.mark.parametrize("dataset,row_id,gold,pred,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_reference_answer_forms(dataset, row_id, gold, pred, expected):
    completion = f"Reasoning ... so the result follows.\n\nThe final answer is \\boxed{{{pred}}}."
    result = grade(completion, gold, profile_for(dataset))
    assert result.extracted_by == "boxed"
    assert result.correct is expected, (dataset, row_id, gold, pred)


def test_profiles():
    assert profile_for("aime24") is INTEGER
    assert profile_for("/data/gsm8k.jsonl") is INTEGER
    assert profile_for("minerva_math") is MINERVA
    assert profile_for("math500").name == "default"


def test_last_boxed_is_brace_matched_and_last():
    text = "first \\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}} end"
    assert last_boxed(text) == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\fbox{7}") == "7"
    # a box cut off by the token budget is skipped in favour of an earlier complete one
    assert last_boxed("\\boxed{3} ... \\boxed{\\frac{1}{") == "3"
    assert last_boxed("no box") is None


def test_extract_answer_fallbacks():
    assert extract_answer("So the final answer is $\\frac{1}{2}$.") == ("\\frac{1}{2}", "phrase")
    assert extract_answer("#### 1,250") == ("1,250", "phrase")
    assert extract_answer("we get 12 and then 1,250") == ("1,250", "last_number")
    assert extract_answer("nothing numeric") == (None, "none")
    assert not is_equiv(None, "3")


BENCH = Path(os.environ.get("RSTITCH_BENCHMARKS") or Path(__file__).resolve().parents[3] / "shared" / "benchmarks")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["aime24", "amc23", "gsm8k", "math500", "minerva_math", "olympiadbench"])
def test_every_reference_grades_against_itself(name):
    """Every stored reference, boxed verbatim, grades correct under its dataset's profile."""
    path = BENCH / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present: set RSTITCH_BENCHMARKS to the folder of the six benchmark files")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    profile = profile_for(name)
    bad = [r["id"] for r in rows if not grade(f"\\boxed{{{r['answer']}}}", r["answer"], profile).correct]
    assert not bad, f"{len(bad)} references do not match themselves: {bad[:10]}"


def test_toyworld_profile_needs_a_boxed_integer_and_no_math_verify(monkeypatch):
    from hf_rstitch.eval import grading
    from hf_rstitch.eval.grading import TOYWORLD, grade, profile_for
    from hf_rstitch.toyworld import grade as toy_grade

    monkeypatch.setattr(grading, "_math_verify", lambda *a: pytest.fail("math-verify reached"))
    assert profile_for("toyworld") is TOYWORLD
    assert grade("so \\boxed{125}", "125", TOYWORLD).correct and toy_grade("so \\boxed{0125}", 125)
    assert not grade("the answer is 125", "125", TOYWORLD).correct  # the default profile takes the phrase
    assert grade("the answer is 125", "125").correct
    assert not toy_grade("\\boxed{12x}", "12") and not toy_grade("\\boxed{}", "0")
