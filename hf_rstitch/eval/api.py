"""``evaluate(config)``: load the pair, run every method on every problem, write the report.

The output folder is the unit of work: ``run.json`` (settings, device, versions, date),
``records.jsonl`` (one record per dataset x problem x method), ``report.md``,
``summary.json`` and plots. Re-running with the same settings resumes; ``report_only``
re-tabulates the records without loading any model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ..hf.loading import load_pair, resolve_device
from .config import RECORDS, RUN_META, EvalConfig  # noqa: F401  (RECORDS, RUN_META: the run's files)
from .data import load_problems
from .provenance import model_provenance
from .report import environment, regrade, table1_markdown, aggregate, write_report
from .runner import OutLock, RecordStore, run_eval

logger = logging.getLogger(__name__)


def clear_stitch_defaults(model: Any) -> None:
    """Drop stitching settings stored in the checkpoint's generation config (threshold, SLM, router):
    with them set, the patched ``generate`` would stitch the LLM-only and SpecDec baselines too, or
    route R-Stitch through a router. The harness passes every setting explicitly."""
    from ..hf.settings import clear_settings

    config = getattr(model, "generation_config", None)
    found = clear_settings(config) if config is not None else {}
    if found:
        logger.warning("ignoring the LLM's generation_config stitching settings %s; each method sets its own routing",
                       found)


def _prepare_out(cfg: EvalConfig, out: Path) -> None:
    """Check that resumed records were made with the same settings, or move them aside."""
    meta_path, rec_path = out / RUN_META, out / RECORDS
    if not cfg.resume and rec_path.exists():
        backup = out / f"records.{time.strftime('%Y%m%d-%H%M%S')}.jsonl.bak"
        shutil.move(rec_path, backup)
        logger.warning("--no-resume: moved old records to %s", backup)
    elif meta_path.exists() and rec_path.exists():
        old = json.loads(meta_path.read_text()).get("settings", {})
        new = cfg.run_settings()
        diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
        if diff:
            raise ValueError(
                f"{out} holds records made with other settings {diff} (old, new); use another --out, "
                "or --no-resume to move the old records aside."
            )


def evaluate(cfg: EvalConfig, *, llm: Any = None, slm: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run (or resume) the evaluation described by ``cfg`` and return the JSON summary.

    ``llm`` / ``slm`` / ``tokenizer`` may be passed already loaded (tests, notebooks); the
    config's ``llm`` / ``slm`` strings are then only labels.
    """
    from .launched import evaluate_launched, launched

    if not cfg.report_only and cfg.shard == "0/1" and (where := launched()) is not None:
        return evaluate_launched(cfg, *where, evaluate, llm=llm, slm=slm, tokenizer=tokenizer)  # torchrun / accelerate launch
    out = Path(cfg.out)
    store = RecordStore(out / RECORDS)
    if cfg.report_only:
        records = store.load()
        meta = json.loads((out / RUN_META).read_text()) if (out / RUN_META).exists() else {}
        return _report(cfg, out, records, meta)

    import hf_rstitch  # noqa: F401  (patches generate with stitched decoding)

    out.mkdir(parents=True, exist_ok=True)
    with OutLock(out):  # one run per --out at a time
        _prepare_out(cfg, out)
        problems = cfg.shard_of([p for src in cfg.data for p in load_problems(src, limit=cfg.limit, columns=cfg.columns)])
        device = resolve_device(cfg.device)
        if llm is None or slm is None or tokenizer is None:
            llm, slm, tokenizer = load_pair(cfg.llm, cfg.slm, cfg.dtype, device)
        else:
            device = str(next(llm.parameters()).device)
        clear_stitch_defaults(llm)
        batch_size = cfg.batch_size_on(device)
        engine = _engine(cfg, llm, slm, tokenizer, problems, batch_size)
        meta = {**environment(), "models": {"llm": model_provenance(cfg.llm), "slm": model_provenance(cfg.slm)},
                "settings": cfg.run_settings(), "batch_size": batch_size, "schedule": cfg.schedule,
                "engine": engine.kind,
                "datasets": list(dict.fromkeys(p.dataset for p in problems))}
        (out / RUN_META).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        _run_methods(cfg, llm, slm, tokenizer, problems, store, engine, batch_size, device)
    return _report(cfg, out, store.load(), meta)


def _run_methods(cfg: EvalConfig, llm, slm, tokenizer, problems, store: RecordStore, engine, batch_size: int,
                 device: str) -> None:
    """Every method of ``cfg`` on every problem not in ``store``: through the request engine where it batches
    (or runs the fast engine), per sample through ``generate`` otherwise (speculative decoding stays at B = 1)."""
    import torch

    from .methods import GenSettings, build_methods

    settings = GenSettings(cfg.max_new_tokens, cfg.do_sample, cfg.temperature, cfg.top_p, cfg.seed)
    methods = build_methods(cfg.methods, llm, slm, settings, thresholds=cfg.thresholds, random_p=cfg.random_p,
                            router=cfg.router, router_threshold=cfg.router_threshold,
                            step_thresholds=cfg.step_thresholds, step_delimiter=cfg.step_delimiter, tokenizer=tokenizer,
                            r2r_router=cfg.r2r_router or None, r2r_thresholds=cfg.r2r_thresholds,
                            speculate_k=cfg.speculate_k)
    if batch_size > 1 or engine.requests_only:
        from .continuous import engine_methods, run_continuous

        batched, methods = engine_methods(methods)
        run_continuous(batched, problems, tokenizer, store, batch_size=batch_size, schedule=cfg.schedule,
                       engine=engine, instruction=cfg.instruction,
                       chat_template=cfg.chat_template, progress=cfg.progress, save_traces=cfg.save_traces)
    run_eval(methods, problems, tokenizer, store, device=torch.device(device), instruction=cfg.instruction,
             chat_template=cfg.chat_template, max_new_tokens=cfg.max_new_tokens, warmup=cfg.warmup,
             progress=cfg.progress, save_traces=cfg.save_traces)


def _engine(cfg: EvalConfig, llm: Any, slm: Any, tokenizer: Any, problems: list, batch_size: int):
    """The engine every batched method shares, built once (:func:`hf_rstitch.engine.build`): lanes and graphs for
    ``batch_size`` rows of the longest prompt + ``max_new_tokens``, with ``--warmup`` every bucket captured now.
    The eager lanes at batch size 1 keep the per-sample ``generate`` path."""
    from ..engine import Pair, build
    from .continuous import longest_request

    longest = longest_request(problems, tokenizer, cfg.instruction, cfg.chat_template, cfg.max_new_tokens)
    sizes = dataclasses.replace(cfg.engine, max_batch=batch_size, max_length=longest, kv_memory=None,
                                warm_up=cfg.warmup)
    return build(Pair.of(llm, slm), sizes.for_requests(cfg.schedule))


def _report(cfg: EvalConfig, out: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    if cfg.regrade:
        records = regrade(records)
    summary = write_report(out, records, meta, plots=cfg.plots)
    summary["table1_markdown"] = table1_markdown(aggregate(records))
    return summary
