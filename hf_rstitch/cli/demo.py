"""``rstitch demo``: the shipped SLM/LLM pair solving held-out problems, offline, on CPU.

Runs LLM-only, SLM-only and R-Stitch at a few thresholds (plus R-Stitch+ when a trained router
ships) on the first N test problems through the evaluation harness, prints the comparison
table, then one problem with every token coloured by the model that wrote it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field

from .args import add_dataclass_args, dataclass_from_args

NAME = "demo"
HELP = "solve held-out toy-world problems with LLM-only, SLM-only and R-Stitch; print the table (offline, CPU)"
DESCRIPTION = (
    "Loads the small SLM/LLM pair that ships with hf-rstitch (trained on multi-step arithmetic word "
    "problems: the LLM verbose and accurate, the SLM concise and weaker), solves the first N held-out "
    "test problems with each method, prints accuracy, latency, speedup and token counts, then shows one "
    "solution with the SLM's tokens and the LLM's tokens in different colours."
)

SLM_COLOUR, LLM_COLOUR, RESET = "\033[36m", "\033[1;35m", "\033[0m"


@dataclass
class DemoConfig:
    n: int = field(default=10, metadata={"help": "number of test problems to solve (1-600); each costs ~4 s of CPU "
                                                 "(the LLM alone ~2.2 s of it), so --n 100 takes about 7 minutes"})
    thresholds: list[float] = field(default_factory=lambda: [0.001, 0.005, 0.02],
                                    metadata={"help": "R-Stitch entropy thresholds tau to compare (this pair is very "
                                                      "confident: from 0.001 up the SLM keeps its concise style and "
                                                      "the LLM fixes the few uncertain digits; below ~0.0005 the "
                                                      "LLM often takes the opening word and writes verbose, slow "
                                                      "reasoning)"})
    device: str = field(default="cpu", metadata={"help": "torch device, e.g. cpu or cuda"})
    seed: int = field(default=0, metadata={"help": "seed for the problem order and any sampling"})
    max_new_tokens: int = field(default=400, metadata={"help": "decoding budget per problem"})
    show: int = field(default=-1, metadata={"help": "index (among the N) of the problem to print coloured; -1 picks "
                                                    "the first one R-Stitch solves with both models writing"})
    colour: bool | None = field(default=None, metadata={
        "help": "colour tokens by model (ANSI); default: only on a terminal and without NO_COLOR"})
    router: bool = field(default=True, metadata={"help": "include R-Stitch+ when a trained router ships"})

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"--n must be at least 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        from ..sources import check_device

        check_device(self.device)
        if not -1 <= self.show < self.n:
            raise ValueError(f"--show must index one of the {self.n} problems (0..{self.n - 1}) or be -1, got {self.show}")
        from ..core.policies import check_threshold

        self.thresholds = [check_threshold(t, "--thresholds") for t in self.thresholds]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, DemoConfig)


def _problems(cfg: DemoConfig):
    import random

    from ..eval.data import Problem
    from ..toyworld.pair import load_test_split

    rows = load_test_split()
    if cfg.n > len(rows):
        raise ValueError(f"--n {cfg.n} exceeds the {len(rows)} shipped test problems; use --n 1 to {len(rows)}")
    random.Random(cfg.seed).shuffle(rows)
    return [Problem(id=str(r["id"]), problem=r["problem"], answer=str(r["answer"]), dataset="toyworld")
            for r in rows[: cfg.n]]


def _router(slm):
    """The R-Stitch+ router shipped beside the pair, or None if this checkout has none."""
    from pathlib import Path

    from ..router.model import load_router

    folder = Path(__file__).resolve().parent.parent / "assets" / "router"
    return load_router(folder, slm) if (folder / "model.safetensors").exists() else None


def _table(summary: dict) -> str:
    stats = summary["toyworld"]
    head = ("method", "acc %", "lat s", "speedup", "LLM tok", "SLM tok", "total", "tok red %", "switches")
    rows = [head]
    for s in stats.values():
        red = s.get("token_reduction_pct")
        rows.append((s["label"], f"{s['acc']:.1f}", f"{s['latency_s']:.3f}",
                     f"{s['speedup']:.2f}x" if s.get("speedup") else "--", f"{s['llm_tokens']:.0f}",
                     f"{s['slm_tokens']:.0f}", f"{s['total_tokens']:.0f}", "--" if red is None else f"{red:+.1f}",
                     f"{s['switches']:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def wants_colour(flag: bool | None, stream=None) -> bool:
    """``--colour`` / ``--no-colour`` if given; else colour only a terminal, and never with ``NO_COLOR`` set (no-color.org)."""
    if flag is not None:
        return flag
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def coloured(tokenizer, new_ids: list[int], roles: list, colour: bool) -> str:
    """The completion with each token tagged by the model that wrote it."""
    from ..core.roles import Role

    out = []
    for tok, role in zip(new_ids, roles):
        text = tokenizer.decode([tok], skip_special_tokens=True)
        if colour:
            out.append((LLM_COLOUR if role is Role.LLM else SLM_COLOUR) + text + RESET)
        else:
            out.append(f"[{text}]" if role is Role.LLM else text)
    return "".join(out)


def _stitch(cfg: DemoConfig, llm, slm, tokenizer, problem, tau: float):
    import torch

    from ..eval.data import prompt_ids

    ids = torch.tensor([prompt_ids(tokenizer, problem.problem, instruction="")], device=cfg.device)
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_threshold=tau,
                       max_new_tokens=cfg.max_new_tokens, do_sample=False, return_dict_in_generate=True)
    return out, out.sequences[0, ids.shape[1]:].tolist()


def _show(cfg: DemoConfig, llm, slm, tokenizer, problems, tau: float) -> None:
    from ..toyworld.pair import grade

    for problem in (problems[cfg.show:cfg.show + 1] if cfg.show >= 0 else problems):
        out, new = _stitch(cfg, llm, slm, tokenizer, problem, tau)
        solved = grade(tokenizer.decode(new, skip_special_tokens=True), problem.answer)
        if cfg.show >= 0 or (solved and out.stitch.llm_tokens and out.stitch.slm_tokens):
            break
    legend = (f"{SLM_COLOUR}SLM{RESET} / {LLM_COLOUR}LLM{RESET}" if cfg.colour else "SLM plain / [LLM in brackets]")
    print(f"\nProblem {problem.id} (answer {problem.answer}, {'solved' if solved else 'not solved'}), "
          f"R-Stitch tau={tau}, tokens: {legend}")
    print(problem.problem)
    print(coloured(tokenizer, new, out.stitch.roles, cfg.colour))
    print(f"-> {out.stitch}")


def run(args: argparse.Namespace) -> int:
    cfg = dataclass_from_args(DemoConfig, args)
    cfg.colour = wants_colour(cfg.colour)
    import torch

    import hf_rstitch  # noqa: F401  (stitched generate)
    from ..eval.methods import GenSettings, build_methods
    from ..eval.report import aggregate
    from ..eval.runner import RecordStore, run_eval
    from ..toyworld.pair import load_pair

    torch.manual_seed(cfg.seed)
    problems = _problems(cfg)  # before loading: --n past the split fails fast
    llm, slm, tokenizer = load_pair(cfg.device)
    settings = GenSettings(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    router = _router(slm) if cfg.router else None
    kinds = ["llm", "slm", "rstitch"] + (["router"] if router is not None else [])
    methods = build_methods(kinds, llm, slm, settings, thresholds=cfg.thresholds, router=router,
                            router_threshold=getattr(router, "threshold", None))
    print(f"hf-rstitch demo: {len(problems)} held-out problems x {len(methods)} methods on {cfg.device} "
          f"(LLM {sum(p.numel() for p in llm.parameters()) / 1e6:.1f}M params, "
          f"SLM {sum(p.numel() for p in slm.parameters()) / 1e6:.1f}M)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore(f"{tmp}/records.jsonl")
        records = run_eval(methods, problems, tokenizer, store, device=cfg.device, instruction="",
                           max_new_tokens=cfg.max_new_tokens)
    print()
    print(_table(aggregate(records)))
    middle = sorted(cfg.thresholds)[len(cfg.thresholds) // 2]
    _show(cfg, llm, slm, tokenizer, problems, middle)
    return 0
