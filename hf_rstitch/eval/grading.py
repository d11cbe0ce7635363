"""Grade a model's final answer against a benchmark's reference answer.

Two steps: :func:`extract_answer` pulls the final answer out of a completion (the content of
the last brace-matched ``\\boxed{...}``, else an "answer is ..." phrase, else the last number),
and :func:`is_equiv` decides whether it matches the reference. Equivalence is tried in order:

1. the same string after :func:`normalize` (``$`` and ``\\$`` dropped, ``\\text{}`` unwrapped,
   degrees, ``\\%``, ``\\!`` spacing and GSM8K/MATH thousands separators removed, ...);
2. a reference that lists several answers (``$69$,$84$``, ``1,3,5``, ``E_{1},E_{2}``) is an
   unordered set: each part must match a distinct part of the prediction;
3. both sides plain numbers (``025``, ``4.5e33``, ``-1./3``, ``4.5 \\times 10^{33}``): equal
   within the profile's relative tolerance, or -- for Minerva's rounded decimals -- equal once
   the prediction is rounded to the reference's significant figures;
4. otherwise math-verify (symbolic / LaTeX equivalence: fractions, radicals, intervals,
   matrices, equations, ``\\pm``).

Why not math-verify's ``parse`` / ``verify`` alone: it already decides leading zeros (``025``),
thousands separators, ``\\$``, units and sets of numbers, but it rejects what steps 2-3 accept for
these benchmarks -- Minerva's rounded decimals at the reference's significant figures (``4.49e33``
for ``4.5e33``), unordered lists of symbols (``E_{2},E_{1}`` for ``E_{1},E_{2}``), Minerva's
Python-isms -- and it cannot be told a benchmark's tolerance or to insist on ``\\boxed{}`` (the
toy world). The surface and numeric steps run first because they are exact and cheap (math-verify
goes through sympy, with timeouts); math-verify decides everything symbolic. Tests pin the gaps
(``tests/cli/test_first_hour.py``), so a rule can go once math-verify covers it.

A :class:`GradingProfile` per benchmark holds the knobs; :func:`profile_for` picks one from a
dataset name. The toy world's answers are graded here too (:data:`TOYWORLD`: a ``\\boxed{}``
integer, no symbolic step). This module knows nothing about models or records and imports
nothing heavy (math-verify only when a symbolic comparison is reached).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# ---- profiles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradingProfile:
    """How strictly numbers compare for one benchmark.

    Attributes:
        name: profile name (``default``, ``integer``, ``minerva``).
        rel_tol: relative tolerance for numeric answers.
        sig_figs: also accept a prediction that rounds to a decimal reference at the
            reference's number of significant figures (``4.49e33`` vs ``4.5e33``).
        boxed_only: the answer must be in a ``\\boxed{}``: no "answer is" phrase or last number.
        symbolic: fall back to math-verify when the surface and numeric checks fail.
    """

    name: str = "default"
    rel_tol: float = 1e-4
    sig_figs: bool = False
    boxed_only: bool = False
    symbolic: bool = True


DEFAULT = GradingProfile()
INTEGER = GradingProfile("integer", rel_tol=1e-9)  # AIME (zero-padded), AMC, GSM8K
MINERVA = GradingProfile("minerva", rel_tol=1e-2, sig_figs=True)  # rounded physics decimals
TOYWORLD = GradingProfile("toyworld", rel_tol=1e-9, boxed_only=True, symbolic=False)  # the shipped pair's integers

_PROFILE_BY_KEYWORD = {"aime": INTEGER, "amc": INTEGER, "gsm8k": INTEGER, "minerva": MINERVA, "toyworld": TOYWORLD}


def profile_for(dataset: str | None) -> GradingProfile:
    """The grading profile for a dataset name (``aime24``, ``minerva_math``, ...)."""
    key = (dataset or "").lower()
    for word, profile in _PROFILE_BY_KEYWORD.items():
        if word in key:
            return profile
    return DEFAULT


# ---- extraction --------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``), braces matched; ``None`` if absent
    or unclosed. ``\\boxed 5`` (no braces) yields ``5``."""
    starts = [m for m in _BOX_RE.finditer(text)]
    for m in reversed(starts):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
            continue  # unclosed (truncated output): try an earlier box
        tail = re.match(r"([^\s$]+)", text[i:])
        if tail:
            return tail.group(1).strip()
    return None


_PHRASE_RES = [
    re.compile(r"final answer is[:\s]*(.+)", re.IGNORECASE),
    re.compile(r"answer is[:\s]*(.+)", re.IGNORECASE),
    re.compile(r"answer:\s*(.+)", re.IGNORECASE),
    re.compile(r"####\s*(.+)"),
]
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?")


def extract_answer(text: str, boxed_only: bool = False) -> tuple[str | None, str]:
    """``(answer, rule)``: the final answer of a completion and which rule found it
    (``boxed``, ``phrase``, ``last_number`` or ``none``; only ``boxed`` or ``none`` with
    ``boxed_only``)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    if boxed_only:
        return None, "none"
    for pattern in _PHRASE_RES:
        hits = pattern.findall(text)
        if hits:
            ans = hits[-1].strip().rstrip(".").strip()
            if ans.startswith("$") and ans.count("$") >= 2:
                ans = ans[1 : ans.index("$", 1)]
            if ans:
                return ans, "phrase"
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return numbers[-1].rstrip(","), "last_number"
    return None, "none"


# ---- normalisation -----------------------------------------------------------------------------

_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ENOTATION_RE = re.compile(r"(?<![\w\\.])(\d+(?:\.\d*)?)[eE]([+-]?\d+)(?![\w.])")
_SPACING = [r"\!", r"\,", r"\;", r"\:", r"\quad", r"\qquad", "~", r"\displaystyle"]


def normalize(ans: str, join_thousands: bool = True) -> str:
    """Surface normalisation shared by both sides (no maths: that is math-verify's job)."""
    s = ans.strip()
    s = s.replace(r"\$", "")
    s = re.sub(r"\$\s*,\s*\$", ", ", s)  # "$69$,$84$": keep the list split visible
    s = s.replace("$", " ")
    for sp in _SPACING:
        s = s.replace(sp, " " if sp.startswith(r"\q") else "")
    s = s.replace(r"\left", "").replace(r"\right", "")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°", "", s)
    s = s.replace(r"\%", "").replace("%", "")
    while _TEXT_RE.search(s):
        s = _TEXT_RE.sub(r"\1", s)
    s = re.sub(r"\bnp\.", "", s)  # Minerva: np.arcsin(10/13)
    s = re.sub(r"(?<![\\a-zA-Z])(arcsin|arccos|arctan|sin|cos|tan|exp|log|ln)(?=\s*\()", r"\\\1", s)
    s = re.sub(r"(\d)\.(?=\s*/)", r"\1", s)  # Minerva: -1./3
    s = _ENOTATION_RE.sub(r"\1\\times 10^{\2}", s)  # 4.5e33 -> 4.5\times 10^{33} (math-verify reads e as Euler's)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    if join_thousands and _THOUSANDS_RE.match(s.replace(" ", "")):
        s = s.replace(" ", "").replace(",", "")
    return s


def split_top_level(s: str) -> list[str]:
    """Split on commas outside any brackets: ``(1,2), (3,4)`` -> two parts."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


# ---- numbers -----------------------------------------------------------------------------------

_FLOAT = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_UNIT_TAIL = r"(?:\s+[a-zA-Z]{2,}(?:\s+[a-zA-Z]+)*(?:\^\{?\d\}?)?)?"
_PLAIN_RE = re.compile(rf"^({_FLOAT}){_UNIT_TAIL}$")
_SCI_RE = re.compile(rf"^({_FLOAT})\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?{_UNIT_TAIL}$")
_INT_RE = re.compile(r"^[+-]?\d+$")
_POW10_RE = re.compile(r"^10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?$")
_FRAC_RE = re.compile(rf"^(-?)\s*(?:\\frac\{{({_FLOAT})\}}\{{({_FLOAT})\}}|({_FLOAT})\s*/\s*({_FLOAT}))$")


def to_number(s: str) -> float | None:
    """A plain number in ``s`` (ints, decimals, e-notation, ``a \\times 10^{b}``, simple
    fractions, a trailing unit word), else ``None``."""
    t = s.strip()
    if m := _PLAIN_RE.match(t):
        return float(m.group(1))
    if m := _SCI_RE.match(t):
        return float(m.group(1)) * 10.0 ** int(m.group(2))
    if m := _POW10_RE.match(t):
        return 10.0 ** int(m.group(1))
    if m := _FRAC_RE.match(t):
        num, den = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
        if float(den) == 0:
            return None
        return (-1 if m.group(1) else 1) * float(num) / float(den)
    return None


def _sig_figs(ref: str) -> int | None:
    """Significant figures of a decimal / e-notation reference (``None`` for bare integers,
    whose trailing zeros are ambiguous)."""
    mantissa = re.split(r"[eE]", ref.strip().lstrip("+-"))[0]
    if "." not in mantissa and not re.search(r"[eE]", ref):
        return None
    digits = mantissa.replace(".", "").lstrip("0")
    return max(len(digits), 1)


def numbers_match(pred: float, gold: float, profile: GradingProfile, gold_text: str = "", pred_text: str = "") -> bool:
    """``pred`` equals ``gold`` within ``profile.rel_tol`` (or after significant-figure rounding).
    Two whole numbers must be equal: a tolerance would accept 32349 for 32348."""
    if _INT_RE.match(pred_text) and _INT_RE.match(gold_text):
        return pred == gold
    if math.isclose(pred, gold, rel_tol=profile.rel_tol, abs_tol=1e-12):
        return True
    if profile.sig_figs and (n := _sig_figs(gold_text)) is not None and pred != 0:
        rounded = float(f"{pred:.{n - 1}e}")
        return math.isclose(rounded, gold, rel_tol=1e-9, abs_tol=1e-15)
    return False


# ---- equivalence -------------------------------------------------------------------------------


def _math_verify(pred: str, gold: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError as err:  # pragma: no cover - dependency missing
        from ..extras import install_hint

        raise ImportError(f"Grading needs math-verify: {install_hint('eval', ('math-verify',))}.") from err
    try:
        g, p = parse(f"${gold}$"), parse(f"${pred}$")
        return bool(g and p and verify(g, p))
    except Exception:  # math-verify raises on exotic input or timeouts; treat as no match
        return False


def _squash(s: str) -> str:
    return s.replace(" ", "").lower()


def _single_equiv(pred: str, gold: str, profile: GradingProfile) -> bool:
    if _squash(pred) == _squash(gold):
        return True
    gnum, pnum = to_number(gold), to_number(pred)
    if gnum is not None and pnum is not None:
        return numbers_match(pnum, gnum, profile, gold, pred)
    if _squash(re.sub(r"^\(?([A-Za-z])\)?$", r"\1", pred)) == _squash(re.sub(r"^\(?([A-Za-z])\)?$", r"\1", gold)):
        return True  # multiple-choice letters: (C) vs C
    return profile.symbolic and _math_verify(pred, gold)


def _set_equiv(pred_parts: list[str], gold_parts: list[str], profile: GradingProfile) -> bool:
    """Unordered match: every gold part pairs with a distinct prediction part."""
    if len(pred_parts) != len(gold_parts):
        return False
    unused = list(pred_parts)
    for g in gold_parts:
        hit = next((p for p in unused if _single_equiv(p, g, profile)), None)
        if hit is None:
            return False
        unused.remove(hit)
    return True


def is_equiv(pred: str | None, gold: str, profile: GradingProfile = DEFAULT) -> bool:
    """Whether the extracted answer ``pred`` matches the reference ``gold``."""
    if pred is None or not pred.strip():
        return False
    g = normalize(gold)
    gold_parts = split_top_level(g)
    if len(gold_parts) > 1:  # a list of answers: compare as an unordered set
        p = normalize(pred, join_thousands=False)
        if _set_equiv(split_top_level(p), gold_parts, profile):
            return True
        return _squash(p) == _squash(g) or (profile.symbolic and _math_verify(p, g))
    p = normalize(pred)
    return _single_equiv(p, g, profile)


@dataclass(frozen=True)
class Grade:
    """The outcome of grading one completion."""

    correct: bool
    extracted: str | None
    extracted_by: str


def grade(completion: str, gold: str, profile: GradingProfile = DEFAULT) -> Grade:
    """Extract the final answer of ``completion`` and compare it with ``gold``."""
    answer, rule = extract_answer(completion, profile.boxed_only)
    return Grade(is_equiv(answer, gold, profile), answer, rule)
