"""What the page shows, as HTML and SVG text from a :class:`~hf_rstitch.ui.run.Snapshot`: the coloured answer, the
entropy plot with the threshold line, the clock line and the summary table. Pure functions of their arguments
(the tokenizer only decodes), so a test reads the same markup the browser gets.

Each token is a ``<span class="tok tok-slm">`` or ``tok-llm``; a hand-over (the writer changes) starts a span with
``handover``. The plot is an inline ``<svg class="entropy-plot">``: one dot per new token for each model that ran
there, and a dashed ``<line class="threshold">`` at tau.
"""

from __future__ import annotations

import html
from typing import Any

from ..core.roles import Role

COLOURS = {Role.SLM: "#0e7490", Role.LLM: "#c026d3"}  # cyan / magenta, as `rstitch demo` prints them
BACKGROUNDS = {Role.SLM: "#cffafe", Role.LLM: "#f5d0fe"}
WEIGHTS = {Role.SLM: 400, Role.LLM: 700}  # the LLM's tokens are few: bold, so they show
WINDOW = 8  # tokens of context when decoding one token (spaces and multi-byte characters that span tokens)


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds: ``decode(window + [t]) - decode(window)``; joined, they are ``decode(ids)``
    wherever a token's text depends on at most :data:`WINDOW` tokens before it."""
    texts = []
    for i in range(len(ids)):
        before = ids[max(0, i - WINDOW):i]
        head = tokenizer.decode(before, skip_special_tokens=True)
        full = tokenizer.decode(before + [ids[i]], skip_special_tokens=True)
        alone = full[len(head):] if full.startswith(head) else tokenizer.decode([ids[i]], skip_special_tokens=True)
        texts.append(alone)
    return texts


def legend() -> str:
    return "".join(f'<span class="tok tok-{r}" style="{_style(r)}">{r.name}</span> ' for r in Role) + (
        '<span style="font-size:0.85em">a bar at a token\'s left edge marks a hand-over</span>')


def _style(role: Role, handover: bool = False) -> str:
    edge = f"border-left:2px solid {COLOURS[role]};" if handover else ""
    return (f"color:{COLOURS[role]};background:{BACKGROUNDS[role]};font-weight:{WEIGHTS[role]};{edge}"
            "white-space:pre-wrap;border-radius:2px")


def tokens_html(tokenizer, ids: list[int], roles: list[Role], pane: str) -> str:
    """The answer, each token in its writer's colour, inside ``<div class="answer" id="answer-{pane}">``."""
    return answer_html(token_texts(tokenizer, ids), roles, pane)


def answer_html(texts: list[str], roles: list[Role], pane: str) -> str:
    """:func:`tokens_html` from the tokens' texts (:func:`token_texts`)."""
    spans = []
    previous = None
    for text, role in zip(texts, roles):
        handover = previous is not None and role is not previous
        cls = f"tok tok-{role}" + (" handover" if handover else "")
        spans.append(f'<span class="{cls}" style="{_style(role, handover)}">{html.escape(text)}</span>')
        previous = role
    body = "".join(spans) or '<span class="empty" style="color:#888">(no tokens yet)</span>'
    return (f'<div class="answer" id="answer-{pane}" style="font-family:monospace;line-height:1.6;'
            f'white-space:pre-wrap">{body}</div>')


def clock_line(seconds: float, n_tokens: int, done: bool, speedup: float | None = None) -> str:
    """``2.31 s, 87 tokens, 37.7 tokens/s`` (the rate once the run ended), with the speed-up where known."""
    rate = f", {n_tokens / seconds:.1f} tokens/s" if done and seconds > 0 else ""
    state = "done" if done else "running"
    extra = f", <b>{speedup:.2f}x</b> the LLM alone" if speedup else ""
    return f'<div class="clock" data-state="{state}">{seconds:.2f} s, {n_tokens} tokens{rate} ({state}){extra}</div>'


def summary_rows(summary: dict[str, Any] | None) -> list[list[Any]]:
    """``out.stitch.summary()`` as ``[name, value]`` rows for the table."""
    if not summary:
        return []
    return [[key, round(value, 4) if isinstance(value, float) else value] for key, value in summary.items()]


def entropy_svg(slm: list[float | None], llm: list[float | None], threshold: float | None,
                width: int = 960, height: int = 190) -> str:
    """The SLM's and the LLM's normalized entropy per new token (dots; a model that did not run there has none)
    on a square-root scale from 0 to 1, and the threshold as a dashed line."""
    n = max(len(slm), len(llm), 1)
    pad, plot_w, plot_h = 34, width - 44, height - 30

    def x(i: int) -> float:
        return pad + (i + 0.5) * plot_w / n

    def y(h: float) -> float:  # sqrt: the thresholds that matter (0.001 - 0.05) sit near 0
        return 8 + plot_h * (1 - min(max(h, 0.0), 1.0) ** 0.5)

    parts = [f'<svg class="entropy-plot" xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 {width} {height}"'
             ' role="img" aria-label="normalized entropy per token">',
             f'<rect x="{pad}" y="8" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>']
    for tick in (0.0, 0.01, 0.1, 0.5, 1.0):
        parts.append(f'<text x="{pad - 3}" y="{y(tick) + 3:.1f}" font-size="9" text-anchor="end">{tick:g}</text>')
    for role, values in ((Role.SLM, slm), (Role.LLM, llm)):
        parts += [f'<circle class="dot-{role}" cx="{x(i):.1f}" cy="{y(h):.1f}" r="2.2" fill="{COLOURS[role]}"/>'
                  for i, h in enumerate(values) if h is not None]
    if threshold is not None:
        parts.append(f'<line class="threshold" x1="{pad}" x2="{pad + plot_w}" y1="{y(threshold):.1f}" '
                     f'y2="{y(threshold):.1f}" stroke="#dc2626" stroke-dasharray="5,3"/>')
        parts.append(f'<text x="{pad + plot_w}" y="{y(threshold) - 3:.1f}" font-size="10" text-anchor="end" '
                     f'fill="#dc2626">tau = {threshold:g}</text>')
    parts.append(f'<text x="{pad}" y="{height - 4}" font-size="10">new token 0 .. {n - 1}: dots are the entropy of '
                 'each model where it ran (SLM cyan, LLM magenta); sqrt scale</text></svg>')
    return "".join(parts)


def message_html(text: str) -> str:
    """A refusal or failure, shown where the answer goes (never a traceback)."""
    return f'<div class="rstitch-error" style="color:#b91c1c;font-weight:600">{html.escape(text)}</div>'
