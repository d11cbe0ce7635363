"""The shipped GEMV tuning table of this GPU kind: every candidate of every product shape of the zoo's models, timed.

    PYTHONPATH=$PWD python tools/gemv_tuning_table.py            # writes the shipped table
    PYTHONPATH=$PWD python tools/gemv_tuning_table.py --out-dir $OUT --models qwen2-7b
    PYTHONPATH=$PWD python tools/gemv_tuning_table.py --rekey hf_rstitch/assets/gemv_tuning/<gpu>.json   # no GPU

The question: which launch configuration each product of a 0.6-8B model runs on this GPU -- the tuner's answer
(:mod:`hf_rstitch.fast.kernels.tuning_cache`), shipped in the package so that a fresh machine of the same kind
(same GPU, torch, Triton and kernel code: the table's keys say so) skips the timing and builds only the chosen
kernels. Each model of :data:`engine_shapes.SHAPES` is made with one layer (the products' shapes do not depend
on the depth) and planned as ``stitch_engine="auto"`` plans it, for lanes of ``--max-rows`` rows, with an empty
table, timing every candidate of the search space (``HF_RSTITCH_TUNE=full``, not the lanes' shortlist); every
timing is recorded too (``gemv_candidates_<gpu>.json``: which candidates win where, and the greedy covers the
shortlists are made of).

Writes ``hf_rstitch/assets/gemv_tuning/<gpu>.json`` (``--table-dir``; replaced whole) and
``gemv_candidates_<gpu>.{json,md}`` under ``--out-dir``; prints one compact JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import sys

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the lab: model shapes, helpers
import lab  # noqa: E402
from engine_shapes import ROWS_ORDER, SHAPES, build  # noqa: E402


def record_timings(log: list):
    """Wrap the tuner's choice (gemv.fastest, gated.fastest) to time every candidate as it does and log each
    time; the choice is unchanged (the fastest, or None where the baseline wins)."""
    from hf_rstitch.fast.kernels import gated, gemv, triton_support

    shape = {}

    def fastest(candidates, run, baseline=None, calls: int = 20):
        entry = {**shape, "rows": candidates[0].block_m, "baseline_ms": None, "ms": {}}
        best, best_ms = None, float("inf")
        if baseline is not None:
            best_ms = entry["baseline_ms"] = triton_support.graph_ms(baseline, calls)
        for cfg in candidates:
            try:
                ms = triton_support.graph_ms(lambda: run(cfg), calls)
            except Exception:  # noqa: BLE001 - as the tuner: a configuration the device cannot run
                continue
            entry["ms"][repr(cfg)] = ms
            if ms < best_ms:
                best, best_ms = cfg, ms
        entry["chosen"] = repr(best)
        log.append(entry)
        return best

    gemv.fastest = gated.fastest = fastest
    for module, kind in ((gemv, "gemv"), (gated, "gated")):
        module.tune = labelled(module.tune, kind, shape)


def labelled(tune, kind: str, shape: dict):
    """``tune`` that notes the kind and weight shape it times in ``shape`` (read by the timings' log)."""
    def run(weight, *args, **kwargs):
        fold = "+norm" if kwargs.get("norm") is not None else "+add" if kwargs.get("add") else ""
        shape.update(kind=kind + fold, n=weight.shape[0], k=weight.shape[1])
        return tune(weight, *args, **kwargs)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=ROWS_ORDER, choices=list(SHAPES))
    ap.add_argument("--max-rows", type=int, default=1, help="lanes of this many rows (1: the one-row and few-rows "
                                                            "tiers; above 16 the wide tier too)")
    ap.add_argument("--table-dir", default=None, help="where the shipped table goes (default: the package's)")
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models under Triton's interpreter on CPU: "
                                                                "checks the script, times nothing")
    ap.add_argument("--rekey", metavar="TABLE", help="rewrite TABLE's keys to this tree's kernel code and exit (no GPU): "
                    "only after a change to the hashed files (gemv.py, gated.py, triton_support.py) that left every "
                    "kernel and search space as it was (read the diff); the table keeps the code it was timed on")
    args = ap.parse_args()
    if args.rekey:
        print(json.dumps(rekey(Path(args.rekey))))
        return
    os.environ["HF_RSTITCH_SHIPPED_TUNING"] = "off"  # time everything: no shipped answer is read,
    os.environ["HF_RSTITCH_TUNE"] = "full"  # every candidate of the search space, not the lanes' shortlists
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    from hf_rstitch.fast import AUTO
    from hf_rstitch.fast.kernels import tuning_cache
    from hf_rstitch.fast.patches import products

    device = "cpu" if args.dry_run_cpu else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu dry run"
    gpu = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    table_dir = Path(args.table_dir) if args.table_dir else tuning_cache.SHIPPED_DIR
    scratch = Path(tempfile.mkdtemp(prefix="gemv_tuning_")) / f"{gpu}.json"
    products.TABLE = tuning_cache.TuningTable(scratch, shipped=[])
    products.TABLE.kept = (device,)
    timings, doc = [], {"environment": lab.environment([device]), "args": vars(args), "models": {}}
    record_timings(timings)
    for model_name in args.models:
        start, first = time.perf_counter(), len(timings)
        model = build(model_name, device, layers=1, tiny=args.dry_run_cpu)
        products.product_layers(model, AUTO, args.max_rows)
        lab.sync(device)
        doc["models"][model_name] = {"seconds": time.perf_counter() - start, "tunings": timings[first:]}
        print(json.dumps({"model": model_name, "seconds": round(doc["models"][model_name]["seconds"], 1),
                          "shapes_tuned": len(timings) - first}), flush=True)
        del model
        entries = ship(scratch, table_dir / f"{gpu}.json")  # after each model: a cut-short run keeps what it has
        doc.update(table=str(table_dir / f"{gpu}.json"), entries=len(entries))
        lab.write_result(Path(args.out_dir) / f"gemv_candidates_{gpu}", doc, markdown(doc, name))
    print(json.dumps({"device": name, "entries": len(entries), "table": doc["table"],
                      "seconds": {m: round(v["seconds"], 1) for m, v in doc["models"].items()}}))


def ship(scratch: Path, table: Path) -> dict:
    """Replace ``table`` with the entries tuned so far (``scratch``, the tuner's file); returns them."""
    entries = json.loads(scratch.read_text())["entries"] if scratch.exists() else {}
    table.parent.mkdir(parents=True, exist_ok=True)
    from hf_rstitch.fast.kernels import tuning_cache

    table.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": entries}, indent=0) + "\n")
    return entries


def rekey(table: Path) -> dict:
    """Give ``table``'s entries this tree's code hash (:func:`tuning_cache.identity`'s ``code`` part), noting in
    ``timed_on_code`` the hashes they were timed with: a configuration keeps its meaning while the kernels and
    their search spaces do not change, whatever else in the hashed files did (the tuner's timing method)."""
    from hf_rstitch.fast.kernels import tuning_cache

    data = json.loads(table.read_text())
    code = tuning_cache._code_hash()
    old = sorted(tuning_cache.key_codes(data["entries"]))
    data["entries"] = {tuning_cache.CODE_IN_KEY.sub(f"|code {code}", k): v for k, v in data["entries"].items()}
    data["timed_on_code"] = sorted(set(data.get("timed_on_code", [])) | set(old) - {code})
    table.write_text(json.dumps(data, indent=0) + "\n")
    return {"table": str(table), "entries": len(data["entries"]), "code": code, "timed_on_code": data["timed_on_code"]}


def cover(tunings: list, tol: float) -> list[str]:
    """The fewest candidates (greedy set cover) among which every tuning's fastest is within ``tol`` of its best
    candidate (or of its baseline, where the baseline won): a candidate list that would have chosen as well."""
    need = []
    for t in tunings:
        best = min([*t["ms"].values(), *([t["baseline_ms"]] if t["baseline_ms"] is not None else [])], default=None)
        ok = {c for c, ms in t["ms"].items() if ms <= best * (1 + tol)}
        if best is not None and not (t["baseline_ms"] is not None and t["baseline_ms"] <= best * (1 + tol)):
            need.append(ok)  # where the baseline is within tol, no candidate is needed
    chosen = []
    while need:
        counts = {}
        for ok in need:
            for c in ok:
                counts[c] = counts.get(c, 0) + 1
        if not counts:
            break
        pick = max(sorted(counts), key=counts.get)
        chosen.append(pick)
        need = [ok for ok in need if pick not in ok]
    return chosen


def covers(doc: dict) -> list[str]:
    """Per kernel and tier: the candidates timed, and the greedy covers at 1, 2 and 3 %."""
    tunings = [t for m in doc["models"].values() for t in m["tunings"]]
    lines = ["", "Fewest candidates that choose within 1 / 2 / 3 % of the best for every shape above (greedy cover):",
             ""]
    for kind, rows in sorted({(t.get("kind"), t["rows"]) for t in tunings}, key=str):
        group = [t for t in tunings if (t.get("kind"), t["rows"]) == (kind, rows)]
        timed = max(len(t["ms"]) for t in group)
        lines.append(f"- {kind}, {rows} rows ({len(group)} shapes, {timed} candidates): "
                     + "; ".join(f"{tol:.0%}: {len(c)} -- " + ", ".join(c) for tol in (0.01, 0.02, 0.03)
                                 for c in [cover(group, tol)]))
    return lines


def markdown(doc: dict, name: str) -> str:
    """Per tuned shape: the candidates timed, the chosen one, and how close the runner-up came."""
    env = doc["environment"]
    lines = [f"# GEMV tuner's timings, {name}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}; one-layer random models, "
             "bf16; every candidate of each shape and tier (ms per product in a CUDA graph).", "",
             "| model | kernel | N x K | rows | candidates | chosen | ms | baseline ms | 2nd best / best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, m in doc["models"].items():
        for t in m["tunings"]:
            times = sorted(t["ms"].values())
            second = f"{times[1] / times[0]:.3f}" if len(times) > 1 else "-"
            base = f"{t['baseline_ms']:.4f}" if t["baseline_ms"] is not None else "-"
            best = f"{times[0]:.4f}" if times else "-"
            lines.append(f"| {model} | {t.get('kind')} | {t.get('n')} x {t.get('k')} | {t['rows']} | {len(t['ms'])} | "
                         f"{t['chosen']} | {best} | {base} | {second} |")
    return "\n".join(lines + covers(doc))


if __name__ == "__main__":
    main()
