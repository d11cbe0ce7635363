"""Step-level routing (GlimpRouter, 2026): one model writes each reasoning step, chosen by a glimpse.

At the start of every reasoning step (the first new token, or the token after a step delimiter such
as a blank line) the SLM proposes the step's first token; its normalized entropy (Eq. 1 of the
R-Stitch paper) decides which model writes the *whole* step: above ``threshold`` the LLM (the
SLM's proposal is discarded, as in R-Stitch), else the SLM. Inside a step nobody switches; the step's
writer keeps control until the step ends. Training-free, like R-Stitch, but routes spans instead of
tokens, so there are far fewer switches (and partial prefills).

How a step end is seen: from the tokens so far (``StepView.tokens``) for the SLM's glimpse, and
from the LLM's most likely token (``StepView.logits``) for the LLM's hand-back, decided before its
token is picked. Under greedy decoding without logits processors that token is the one written, so
the routing is exact. Under sampling, a sampled token that differs from the most likely one moves a
boundary by one token: when the LLM's most likely token ends the step but the sample does not, the
SLM finds the row mid-step and hands it straight back (one SLM forward wasted, routing unchanged);
when the sample ends a step the LLM did not expect, the LLM also writes the next step's first token
and the SLM's glimpse then decides who writes the rest of that step.

This module is pure decision logic: tensors in, tensors out, plus a tokenizer's strings for the
delimiter.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .policies import StepView, check_threshold


_TEXTS: dict[int, tuple[object, list[str]]] = {}  # id(tokenizer) -> (tokenizer, each id's text): decoded once


def token_texts(tokenizer) -> list[str]:
    """Each token id's text, decoded once per tokenizer (a served request's policy reuses them)."""
    kept = _TEXTS.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer:
        if len(_TEXTS) >= 4:
            _TEXTS.clear()
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        kept = _TEXTS[id(tokenizer)] = (tokenizer, texts)
    return kept[1]


class StepEnds:
    """Which token tails end a reasoning step: the decoded tail ends with ``delimiter``, or (with
    ``ids``) the last token is one of the given ids.

    Args:
        delimiter: the text that ends a step (``"\\n\\n"``: a blank line).
        tokenizer: decodes each id once (``batch_decode``) to find the delimiter in any split over tokens.
        ids: token ids that each end a step; replaces the text check (models without a tokenizer).
    """

    def __init__(self, delimiter: str = "\n\n", tokenizer=None, ids: Iterable[int] | None = None):
        if ids is not None:
            self.ids, self.texts, self.width = frozenset(int(i) for i in ids), None, 1
            return
        if not isinstance(delimiter, str) or not delimiter:
            raise ValueError(f"the step delimiter must be a non-empty string, got {delimiter!r}; e.g. '\\n\\n'.")
        if tokenizer is None:
            raise ValueError("StepPolicy needs the tokenizer to find the step delimiter among token ids: "
                             "StepPolicy(threshold, delimiter='\\n\\n', tokenizer=tok), or give the ids that end a "
                             "step: StepPolicy(threshold, step_ends=[ids]).")
        self.ids, self.delimiter = None, delimiter
        self.texts = token_texts(tokenizer)
        self.width = len(delimiter)  # a token holds >= 1 character: the last `width` tokens hold the delimiter

    def __call__(self, tails: list[list[int]]) -> torch.Tensor:
        """``[B]`` bool (host): each row's tail (its last tokens, oldest first) ends a step."""
        if self.ids is not None:
            return torch.tensor([bool(t) and t[-1] in self.ids for t in tails], dtype=torch.bool)
        texts, n = self.texts, len(self.texts)
        return torch.tensor([("".join(texts[i] if 0 <= i < n else "" for i in t)).endswith(self.delimiter)
                             for t in tails], dtype=torch.bool)


class StepPolicy:
    """GlimpRouter-style step routing (see the module docstring).

    Args:
        threshold: tau on the SLM's normalized entropy at a step's first token: above it, the LLM
            writes the step.
        delimiter: text that ends a step (default: a blank line).
        tokenizer: the pair's tokenizer (needed for a text delimiter).
        step_ends: token ids that each end a step, instead of ``delimiter`` / ``tokenizer``.
    """

    needs_hidden = False

    def __init__(self, threshold: float, delimiter: str = "\n\n", tokenizer=None,
                 step_ends: Iterable[int] | None = None):
        self.threshold = check_threshold(threshold)
        self.delimiter = delimiter
        self.ends = StepEnds(delimiter, tokenizer, step_ends)
        self._llm_step = torch.zeros(0, dtype=torch.bool)  # [rows] host: the LLM writes the row's current step
        self._fresh: set[int] = set()  # rows whose next SLM glimpse is their first token (start_rows)

    def reset(self) -> None:
        self._llm_step = torch.zeros(0, dtype=torch.bool)
        self._fresh = set()

    def start_rows(self, rows: Iterable[int]) -> None:
        """Rows that join a running batch (the request engine) start a step at their first token, whatever
        ``StepView.index`` (the engine's step count) says."""
        self._fresh.update(int(r) for r in rows)

    def _rows(self, step: StepView) -> torch.Tensor:
        rows = step.row_ids()
        need = int(rows.max()) + 1 if len(rows) else 0
        if need > len(self._llm_step):  # rows joining a served batch
            self._llm_step = torch.cat([self._llm_step, torch.zeros(need - len(self._llm_step), dtype=torch.bool)])
        return rows

    def _tails(self, step: StepView, keep: int) -> list[list[int]]:
        if step.tokens is None:
            raise ValueError("StepPolicy needs the tokens so far (StepView.tokens); this caller passed none.")
        return step.tokens[:, step.tokens.shape[1] - keep:].tolist() if keep > 0 else [[] for _ in step.tokens]

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        """At a step's first token: the LLM takes the step when the SLM's entropy is above tau. Inside a
        step: the step's writer (the SLM keeps its rows; a row the LLM's step owns goes back to it)."""
        rows = self._rows(step)
        start = torch.ones(len(rows), dtype=torch.bool) if step.index == 0 else self.ends(self._tails(step, self.ends.width))
        if self._fresh:
            fresh = torch.tensor([r in self._fresh for r in rows.tolist()], dtype=torch.bool)
            start, self._fresh = start | fresh, self._fresh - set(rows.tolist())
        if bool(start.any()):
            high = (step.entropy > self.threshold).cpu()
            self._llm_step[rows[start]] = high[start]
        return self._llm_step[rows].clone()

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        """After an LLM token: back to the SLM when that token (the LLM's most likely one) ends the step."""
        if step.logits is None:
            raise ValueError("StepPolicy needs the LLM's logits (StepView.logits); this caller passed none.")
        rows = self._rows(step)
        token = step.logits.argmax(dim=-1).tolist()
        tails = [t + [k] for t, k in zip(self._tails(step, self.ends.width - 1), token)]
        ends = self.ends(tails)
        self._llm_step[rows[ends]] = False
        return ends | ~self._llm_step[rows]

    def __repr__(self) -> str:
        return f"StepPolicy(threshold={self.threshold}, delimiter={self.delimiter!r})"
