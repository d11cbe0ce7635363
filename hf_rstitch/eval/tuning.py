"""The measuring half of ``rstitch tune``: the dev split through the one batched sweep, then the choice.

:func:`hf_rstitch.eval.batched.sweep` decodes the problems as left-padded batches (every row routes on its
own) with the LLM alone -- the reference, what tau = 0 stitches to --, R-Stitch at each threshold and, if
asked, a router; grades them with the one grader; and, with a latency model, predicts each setting's mean
latency (paper Eq. 4 over a stitched row's trace, :func:`~hf_rstitch.eval.batched.llm_alone_ms` for the LLM
alone). Here each row of the sweep becomes a :class:`~hf_rstitch.eval.choose.SweepPoint`; the choice itself
is :func:`hf_rstitch.eval.choose.choose`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..resources import resolve, shipped
from .batched import as_problems, sweep
from .choose import SweepPoint, choose, table
from .data import Problem, default_instruction, load_problems
from .methods import GenSettings

ToySplit = Callable[[int], "tuple[list[dict], str]"]  # n -> (the toy world's dev rows, a name for them)


def dev_set(cfg, toy_split: ToySplit | None = None) -> tuple[list[Problem], str, str]:
    """The dev problems, the instruction and a name for the split: ``cfg.data``'s, else (the shipped pair)
    ``toy_split(cfg.n)``'s -- the caller's, since evaluation does not import the toy world. The shipped pair's
    problems are graded as the toy world's (a ``\\boxed{}`` integer), a file's by its name as ``rstitch eval``
    grades it."""
    if cfg.data:
        problems, name = load_problems(cfg.data, limit=cfg.n, columns=cfg.columns), cfg.data
    elif toy_split is not None:
        rows, name = toy_split(cfg.n)
        problems = as_problems(rows)
    else:
        raise ValueError("--data is required (a dev split: JSONL file, local file or Hub dataset) unless the pair is "
                         "the shipped one.")
    instruction = cfg.instruction if cfg.instruction is not None else default_instruction(cfg.llm, cfg.slm)
    return problems, instruction, name


def to_point(row: dict[str, Any], baseline_ms: float | None) -> SweepPoint:
    """A row of :func:`~hf_rstitch.eval.batched.sweep` as a point of the choice (the LLM alone is tau = 0; a
    router's point has no plain threshold); its speed-up over the LLM alone where both latencies are predicted."""
    kind = row["kind"]
    latency = row.get("latency_ms")
    speedup = baseline_ms / latency if baseline_ms is not None and latency else None
    threshold = 0.0 if kind == "llm" else row["param"] if kind == "rstitch" else None
    return SweepPoint(threshold, 100.0 * row["accuracy"], row["llm_token_share"] if kind != "llm" else 1.0,
                      row["new_tokens"], speedup, kind)


def is_shipped_pair(cfg) -> bool:
    return resolve(cfg.llm) == str(shipped("llm")) and resolve(cfg.slm) == str(shipped("slm"))


def load(cfg, device: str):
    """(llm, slm, tokenizer) with any stored stitching settings cleared."""
    from ..hf.settings import clear_settings
    from ..hf.loading import load_pair

    llm_ref, slm_ref = resolve(cfg.llm), resolve(cfg.slm)
    llm, slm, tok = load_pair(llm_ref, slm_ref, cfg.dtype, device)
    clear_settings(llm.generation_config)
    return llm, slm, tok


def measure(cfg, llm, slm, tok, problems: list[Problem], instruction: str, latency) -> list[dict[str, Any]]:
    """:func:`~hf_rstitch.eval.batched.sweep`'s rows for the LLM alone (first), each threshold and the router,
    behind a progress bar of ``generate`` calls."""
    from tqdm.auto import tqdm

    methods = ["llm", "rstitch"] + (["router"] if cfg.router else [])
    calls = -(-len(problems) // cfg.batch_size) * (1 + len(cfg.thresholds) + bool(cfg.router))
    with tqdm(total=calls, disable=not cfg.progress, unit="batch", desc="rstitch tune") as bar:
        return sweep(llm, slm, tok, problems, cfg.thresholds, methods=methods,
                     settings=GenSettings(max_new_tokens=cfg.max_new_tokens), batch_size=cfg.batch_size,
                     instruction=instruction, latency_model=latency, router=cfg.router or None,
                     log=lambda _: bar.update(1))


@torch.no_grad()
def tune(cfg, toy_split: ToySplit | None = None) -> dict[str, Any]:
    """Run the sweep described by a :class:`~hf_rstitch.cli.tune.TuneConfig`; returns the JSON result plus ``table``.
    ``toy_split``: the shipped pair's dev rows when ``cfg.data`` is empty (:func:`dev_set`)."""
    from ..hf.loading import resolve_device
    from ..latency import LatencyModel
    from .provenance import model_provenance

    latency = LatencyModel.load(resolve(cfg.latency)) if cfg.latency else None
    device = resolve_device(cfg.device)
    # the dev split first: a bad file fails before the models load
    problems, instruction, data_name = dev_set(cfg, toy_split if is_shipped_pair(cfg) else None)
    llm, slm, tok = load(cfg, device)
    if latency is not None:
        latency.check_models(slm=slm, llm=llm, check_name=False)
    rows = measure(cfg, llm, slm, tok, problems, instruction, latency)
    baseline = rows[0].get("latency_ms")  # the LLM alone's, predicted (methods run in the order given)
    points = [to_point(row, baseline) for row in rows]
    reference, sweep_points = points[0], [p for p in points if p.label != "router"]
    choice = choose(sweep_points, reference.accuracy, cfg.max_drop, cfg.target_speedup)
    result = {
        "threshold": None if choice.point is None else choice.point.threshold,
        "accuracy": None if choice.point is None else choice.point.accuracy,
        "speedup": None if choice.point is None else choice.point.speedup,
        "reference_accuracy": reference.accuracy, "reason": choice.reason,
        "max_drop": cfg.max_drop, "target_speedup": cfg.target_speedup,
        "router": next((p.to_dict() for p in points if p.label == "router"), None),
        "points": [p.to_dict() for p in sweep_points], "data": data_name, "n": len(problems),
        "latency": cfg.latency or None,
        "models": {"llm": model_provenance(cfg.llm), "slm": model_provenance(cfg.slm)},
        "table": table(points, choice.point),
    }
    if cfg.write_config and choice.point is not None:
        result["wrote"] = write_config(llm, cfg, choice.point.threshold)
    return result


def write_config(llm, cfg, threshold: float) -> str:
    """Store tau (and the SLM / router references) on the LLM's generation config; write it into ``cfg.write_config``."""
    from pathlib import Path

    from ..hf.settings import configure

    slm_ref = resolve(cfg.slm)  # shipped:slm -> its folder, which from_pretrained can load
    configure(llm, threshold=threshold, slm=slm_ref, router=cfg.router or None)
    out = Path(cfg.write_config)
    out.mkdir(parents=True, exist_ok=True)
    llm.generation_config.save_pretrained(out)
    return str(out / "generation_config.json")
