"""The measuring half of ``rstitch tune``: decode a dev split at each threshold, grade, predict latency.

Each threshold decodes the problems as left-padded batches (every row routes on its own); the LLM
alone (plain ``generate``; what tau = 0 stitches to) is the reference. With a latency model, each point's latency is predicted from its traces (paper
Eq. 4) and compared with the LLM alone's, predicted for the same prompts and answer lengths. The
choice itself is :func:`hf_rstitch.eval.choose.choose`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..resources import resolve, shipped
from .choose import SweepPoint, choose, table
from .data import default_instruction, load_problems, prompt_ids

DEV_SEED = 0  # the shipped pair's valid split: rstitch toyworld data --split valid --seed 0


def dev_set(cfg, toy: bool) -> tuple[list[tuple[str, str]], str, Callable[[str, str], bool], str]:
    """``[(problem, answer)]``, the instruction, the grader and a name for the dev split."""
    if cfg.data:
        rows = [(p.problem, p.answer) for p in load_problems(cfg.data, limit=cfg.n, columns=cfg.columns)]
        name = cfg.data
    elif toy:
        from ..toyworld.tasks import make_split

        rows = [(r["problem"], r["answer"]) for r in make_split("valid", cfg.n, DEV_SEED)]
        name = f"toyworld valid split (seed {DEV_SEED})"
    else:
        raise ValueError("--data is required (a dev split: JSONL file, local file or Hub dataset) unless the pair is "
                         "the shipped one.")
    instruction = cfg.instruction if cfg.instruction is not None else default_instruction(cfg.llm, cfg.slm)
    from .grading import TOYWORLD, grade

    if toy:
        return rows, instruction, lambda text, answer: grade(text, str(answer), TOYWORLD).correct, name

    return rows, instruction, lambda text, answer: grade(text, answer).correct, name


def llm_alone_ms(latency, prompt_len: int, n_tokens: int) -> float:
    """Predicted latency of the LLM writing ``n_tokens`` after a ``prompt_len`` prompt: a prefill, then decode steps."""
    calls = [{"role": "llm", "n_inf": prompt_len, "n_kv": 0}]
    calls += [{"role": "llm", "n_inf": 1, "n_kv": prompt_len + i} for i in range(n_tokens - 1)]
    return latency.predict_trace({"calls": calls, "roles": ["llm"] * n_tokens})


def _batches(tok, rows, instruction: str, batch_size: int, device) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    from .batched import left_pad

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids, mask = left_pad([prompt_ids(tok, problem, instruction) for problem, _ in chunk], pad)
        out.append((ids.to(device), mask.to(device), [answer for _, answer in chunk]))
    return out


def measure(llm, slm, tok, batches, grader, bar, max_new_tokens: int, **stitch: Any) -> dict[str, Any]:
    """Correct answers, traces and prompt lengths of one setting (``stitch_threshold=`` or ``stitch_router=``)."""
    right, traces, prompt_lens = 0, [], []
    for ids, mask, answers in batches:
        out = llm.generate(ids, attention_mask=mask, assistant_model=slm, max_new_tokens=max_new_tokens,
                           return_dict_in_generate=True, **stitch)
        rows = out.stitch if isinstance(out.stitch, list) else [out.stitch]
        texts = tok.batch_decode(out.sequences[:, ids.shape[1]:], skip_special_tokens=True)
        right += sum(bool(grader(t, a)) for t, a in zip(texts, answers))
        traces += rows
        prompt_lens += mask.sum(-1).tolist()
        bar.update(1)
    return {"right": right, "traces": traces, "prompt_lens": prompt_lens}


def new_tokens(sequences: torch.Tensor, prompt_width: int, eos: set[int]) -> list[int]:
    """Tokens each row generated, up to and including its first EOS."""
    counts = []
    for row in sequences[:, prompt_width:].tolist():
        ends = [i for i, tok in enumerate(row) if tok in eos]
        counts.append(ends[0] + 1 if ends else len(row))
    return counts


def measure_alone(llm, tok, batches, grader, bar, max_new_tokens: int) -> dict[str, Any]:
    """The LLM alone (plain ``generate``): correct answers, new tokens and prompt lengths per row."""
    eos = llm.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    right, lengths, prompt_lens = 0, [], []
    for ids, mask, answers in batches:
        seq = llm.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens)
        texts = tok.batch_decode(seq[:, ids.shape[1]:], skip_special_tokens=True)
        right += sum(bool(grader(t, a)) for t, a in zip(texts, answers))
        lengths += new_tokens(seq, ids.shape[1], eos)
        prompt_lens += mask.sum(-1).tolist()
        bar.update(1)
    return {"right": right, "lengths": lengths, "prompt_lens": prompt_lens}


def to_point(m: dict[str, Any], n: int, label: str, threshold, latency, baseline_ms: float | None) -> SweepPoint:
    tokens = sum(t.n_tokens for t in m["traces"])
    speedup = None
    if latency is not None and baseline_ms is not None:
        speedup = baseline_ms / sum(latency.predict_trace(t) for t in m["traces"])
    return SweepPoint(threshold, 100.0 * m["right"] / n, sum(t.llm_tokens for t in m["traces"]) / max(tokens, 1),
                      tokens / n, speedup, label)


def is_shipped_pair(cfg) -> bool:
    return resolve(cfg.llm) == str(shipped("llm")) and resolve(cfg.slm) == str(shipped("slm"))


def load(cfg, device: str):
    """(llm, slm, tokenizer, is the shipped pair) with any stored stitching settings cleared."""
    from ..hf.settings import clear_settings
    from .api import load_pair

    llm_ref, slm_ref = resolve(cfg.llm), resolve(cfg.slm)
    llm, slm, tok = load_pair(llm_ref, slm_ref, cfg.dtype, device)
    clear_settings(llm.generation_config)
    return llm, slm, tok, is_shipped_pair(cfg)


@torch.no_grad()
def tune(cfg) -> dict[str, Any]:
    """Run the sweep described by a :class:`~hf_rstitch.cli.tune.TuneConfig`; returns the JSON result plus ``table``."""
    from tqdm.auto import tqdm

    from ..latency import LatencyModel
    from .api import resolve_device
    from .provenance import model_provenance

    latency = LatencyModel.load(resolve(cfg.latency)) if cfg.latency else None
    device = resolve_device(cfg.device)
    rows, instruction, grader, data_name = dev_set(cfg, is_shipped_pair(cfg))  # a bad file fails before loading
    llm, slm, tok, toy = load(cfg, device)
    if latency is not None:
        latency.check_models(slm=slm, llm=llm, check_name=False)
    batches = _batches(tok, rows, instruction, cfg.batch_size, llm.device)
    settings = [("rstitch", tau, {"stitch_threshold": tau}) for tau in cfg.thresholds]
    if cfg.router:
        settings.append(("router", None, {"stitch_router": cfg.router}))
    bar = tqdm(total=(len(settings) + 1) * len(batches), disable=not cfg.progress, unit="batch", desc="rstitch tune")
    alone = measure_alone(llm, tok, batches, grader, bar, cfg.max_new_tokens)
    measured = [(label, tau, measure(llm, slm, tok, batches, grader, bar, cfg.max_new_tokens, **kw))
                for label, tau, kw in settings]
    bar.close()
    baseline = None if latency is None else sum(
        llm_alone_ms(latency, p, n) for p, n in zip(alone["prompt_lens"], alone["lengths"]))
    reference = SweepPoint(0.0, 100.0 * alone["right"] / len(rows), 1.0, sum(alone["lengths"]) / len(rows),
                           None if latency is None else 1.0, "llm")  # tau = 0 stitches to the LLM alone
    points = [reference] + [to_point(m, len(rows), label, tau, latency, baseline) for label, tau, m in measured]
    sweep = [p for p in points if p.label != "router"]
    choice = choose(sweep, reference.accuracy, cfg.max_drop, cfg.target_speedup)
    result = {
        "threshold": None if choice.point is None else choice.point.threshold,
        "accuracy": None if choice.point is None else choice.point.accuracy,
        "speedup": None if choice.point is None else choice.point.speedup,
        "reference_accuracy": reference.accuracy, "reason": choice.reason,
        "max_drop": cfg.max_drop, "target_speedup": cfg.target_speedup,
        "router": next((p.to_dict() for p in points if p.label == "router"), None),
        "points": [p.to_dict() for p in sweep], "data": data_name, "n": len(rows), "latency": cfg.latency or None,
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
