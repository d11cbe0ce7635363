"""What ``stitch_engine="auto"`` does on every causal LM transformers ships: fast or eager, equal or not, how fast.

The pairs are the zoo suite's (``tests/zoo_models.py``: every model_type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``
as a tiny random float32 pair, a threshold where routes mix, B = 1 and 3 left padded, greedy and seeded
sampling). Per architecture it records

* what ``"auto"`` (the default engine) picks -- ``engine`` "fast" | "eager", ``reason`` when eager -- whether its
  tokens equal the eager engine's (``stitch_engine="default"``) in every case, any ``error``, and
  ``speedup_vs_eager``: ms a token of the eager engine / ms a token with ``"auto"`` (greedy, B = 1, 32 tokens,
  median of 3 after a warm call; tiny models, so this is the host cost a token; only where auto runs fast);
* ``auto_near`` (where auto runs fast): ``"auto"`` at B = 3, greedy and sampled, at thresholds 1e-6 (CUDA; 2e-6
  on the CPU; ZOO_NEAR_MARGIN sets it) above and below entropies the eager engine saw (a fast engine whose
  entropies move by more flips a hand-over there; ZOO_NEAR_BY_NAME=1 runs "fast" by name instead of auto);
* ``fast_by_name``: the same cases on the fast engine named explicitly with auto's configuration (what
  ``"auto"`` would run were the architecture proven), to find what is provable
  (:data:`hf_rstitch.fast.support.PROVEN` is extended from these rows).

Writes ``benchmarks/results/zoo_<device>.json`` after every architecture (a timeout loses nothing), a markdown
table beside it, and with ``--docs`` the users' table ``docs/models.md``. Architectures run in ``--workers``
processes (one GPU shared: the compiles of ``compile="parts"`` cost seconds per architecture); one that runs
past ``--timeout`` seconds is recorded as such and its worker replaced.

    PYTHONPATH=. python benchmarks/zoo.py --device cuda --workers 8 --timeout 150 --budget 500 --docs docs/models.md
    PYTHONPATH=. python benchmarks/zoo.py --device cpu --workers 2 --only llama,gpt2   # the CPU static path
    PYTHONPATH=. python benchmarks/zoo.py --only glm4,helium --update benchmarks/results/zoo_<gpu>.json  # re-run some
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

TIMED_TOKENS = 32


def run_arch(model_type: str, device: str) -> dict:
    """One architecture's row (see the module docstring)."""
    import torch

    import hf_rstitch  # noqa: F401  (patches generate)
    from hf_rstitch.engine import EngineConfig, Pair, choose
    from hf_rstitch.fast import FastConfig, support
    from zoo_models import CASES, NotBuildable, build_pair, pick_threshold, stitched

    try:
        llm, slm = build_pair(model_type)
    except NotBuildable as err:
        return {"excluded": str(err)}
    llm, slm = llm.to(device), slm.to(device)
    threshold = pick_threshold(slm)
    row = {"threshold": round(threshold, 6)}
    eager = {}
    for case in CASES:  # where the eager engine itself fails there is nothing for auto to keep working
        try:
            eager[case] = stitched(llm, slm, *case, threshold, "default")
        except Exception as err:  # noqa: BLE001
            row.setdefault("eager_fails", []).append(f"{case[0]} B={case[1]}: {type(err).__name__}: {_line(err)}")
    if not eager:
        return {**row, "excluded": f"the eager engine fails in every case ({row['eager_fails'][0]})"}
    on_cuda = torch.device(device).type == "cuda"
    picked = choose(Pair.of(llm, slm), EngineConfig(kind="auto", max_batch=3)).fast
    # off CUDA "auto" is always eager: the row shows the static path by name (FastConfig(graphs=False))
    config = picked if isinstance(picked, FastConfig) else (FastConfig(compile="parts") if on_cuda else
                                                              FastConfig(graphs=False))
    row["fast_by_name"] = _compare(llm, slm, threshold, config, eager)
    auto = _compare(llm, slm, threshold, None, eager)
    failed = support.failure(llm, slm)
    fast = isinstance(picked, FastConfig) and failed is None
    row.update(engine="fast" if fast else "eager", equal=auto["equal"])
    if not fast:
        row["reason"] = f"fell back: {failed}" if failed else support.why_not_fast(llm, slm, 3)
    if auto.get("error"):
        row["error"] = auto["error"]
    if fast:
        row["auto_near"] = _near(llm, slm, threshold, on_cuda)
    if auto["equal"] and fast:  # (where auto runs the eager engine both columns would time the same engine)
        eager_ms, auto_ms = (_ms_per_token(llm, slm, threshold, spec) for spec in ("default", None))
        row.update(ms_per_token={"eager": eager_ms, "auto": auto_ms}, speedup_vs_eager=round(eager_ms / auto_ms, 2))
    return row


def _compare(llm, slm, threshold, engine, eager) -> dict:
    """``{"equal": tokens and routes equal to the eager engine's in every case, "error": ...}``."""
    import torch

    from zoo_models import stitched

    out = {"equal": True}
    for case, (want, roles) in eager.items():
        try:
            got, got_roles = stitched(llm, slm, *case, threshold, engine)
        except ValueError as err:
            if "fast engine" in str(err):  # refused up front, with the reason
                return {"equal": False, "refused": _line(err)}
            return {"equal": False, "error": f"{case[0]} B={case[1]}: ValueError: {_line(err)}"}
        except Exception as err:  # noqa: BLE001  (what the row reports)
            return {"equal": False, "error": f"{case[0]} B={case[1]}: {type(err).__name__}: {_line(err)}"}
        if not (torch.equal(got.cpu(), want.cpu()) and got_roles == roles):
            out = {"equal": False, "differs": f"{case[0]} B={case[1]}"}
    return out


def _near(llm, slm, threshold, on_cuda: bool) -> dict:
    """"auto" at B = 3, greedy and sampled, at thresholds the zoo suite's margin (1e-6 on CUDA, 2e-6 on the CPU)
    above and below entropies the eager engine saw: ``{"equal", "thresholds", "differs"?}``."""
    import torch

    from zoo_models import NEAR_CASES, near_thresholds, observed_entropies, stitched

    margin = os.environ.get("ZOO_NEAR_MARGIN")  # e.g. 1e-6: thresholds that far from the entropies instead
    margin = float(margin) if margin else (1e-6 if on_cuda else 2e-6)  # tests/zoo: GPU_MARGIN, CPU_MARGIN
    spec = "fast" if os.environ.get("ZOO_NEAR_BY_NAME") else None  # "fast" by name (no compile) instead of auto
    out = {"equal": True, "thresholds": 0, "margin": margin, "engine": spec or "auto"}
    for decoding, batch in NEAR_CASES:
        seen = observed_entropies(llm, slm, decoding, batch, threshold)
        for t in near_thresholds(seen, margin):
            out["thresholds"] += 1
            want, got = (stitched(llm, slm, decoding, batch, t, s) for s in ("default", spec))
            if not (torch.equal(got[0].cpu(), want[0].cpu()) and got[1] == want[1]):
                return {**out, "equal": False, "differs": f"{decoding} B={batch} threshold {t!r}"}
    return out


def _ms_per_token(llm, slm, threshold, engine) -> float:
    from lab import timed
    from zoo_models import prompts

    ids, mask = prompts(1, llm.device)

    def run():
        return llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=threshold,
                            stitch_engine=engine, max_new_tokens=TIMED_TOKENS, min_new_tokens=TIMED_TOKENS)

    run()  # warm: lanes built, graphs captured
    seconds, _ = timed(run, llm.device, repeats=3)
    return round(1000 * seconds / TIMED_TOKENS, 3)


def _line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:240] if text else ""


def serve(device: str) -> None:
    """Worker: a model_type a line on stdin -> its row as one JSON line on stdout."""
    import torch

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    torch.set_num_threads(int(os.environ.get("ZOO_THREADS", "1")))
    out = os.fdopen(os.dup(1), "w")  # the result channel; anything else written to fd 1 (models, compilers)
    os.dup2(2, 1)  # goes to stderr instead
    sys.stdout = sys.stderr
    for line in sys.stdin:
        model_type = line.strip()
        start = time.perf_counter()
        try:
            row = run_arch(model_type, device)
        except Exception as err:  # noqa: BLE001
            row = {"error": f"{type(err).__name__}: {_line(err)}"}
        row["seconds"] = round(time.perf_counter() - start, 1)
        out.write(json.dumps({"model_type": model_type, "row": row}) + "\n")
        out.flush()


class Worker:
    """One ``--serve`` process (its own process group: a timeout kills its compile workers too)."""

    def __init__(self, device: str, workers: int = 1):
        env = dict(os.environ)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // max(workers, 1))))
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--device", device], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env, start_new_session=True)
        self.task, self.since = None, 0.0

    def give(self, model_type: str) -> None:
        self.task, self.since = model_type, time.monotonic()
        self.proc.stdin.write(model_type + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run_all(types: list[str], device: str, workers: int, timeout: float, write, budget: float = 0) -> dict:
    """Every type through a pool of worker processes; ``write(rows)`` after each row. Past ``budget`` seconds
    (0: none) what is left is recorded as not run."""
    rows, todo, start = {}, list(types), time.monotonic()
    pool = [Worker(device, workers) for _ in range(min(workers, len(types)))]
    while len(rows) < len(types):
        if budget and time.monotonic() - start > budget:
            for t in [w.task for w in pool if w.task is not None] + todo:
                rows[t] = {"error": f"not run: the --budget of {budget:.0f} s ran out"}
            write(rows)
            break
        for w in pool:
            if w.task is None and todo:
                w.give(todo.pop(0))
        busy = {w.proc.stdout: w for w in pool if w.task is not None}
        ready, _, _ = select.select(list(busy), [], [], 1.0)
        for stream in ready:
            w = busy[stream]
            line = stream.readline()
            if line and not line.startswith('{"model_type"'):
                continue  # not a result (the worker writes results only; be safe anyway)
            if line:
                done = json.loads(line)
                rows[done["model_type"]] = done["row"]
                print(f"[{len(rows)}/{len(types)}] {done['model_type']}: {done['row'].get('engine', '')} "
                      f"{done['row'].get('seconds', '')} s", file=sys.stderr, flush=True)
            else:  # the worker died (a crash outside Python's reach)
                rows[w.task] = {"error": f"the worker process died (exit {w.proc.wait()})"}
                pool[pool.index(w)] = Worker(device, workers)
            w.task = None
            write(rows)
        for i, w in enumerate(pool):
            if w.task is not None and time.monotonic() - w.since > timeout:
                rows[w.task] = {"error": f"timeout: still running after {timeout:.0f} s"}
                w.stop()
                pool[i] = Worker(device, workers)
                write(rows)
    for w in pool:
        w.stop()
    return rows


def counts(rows: dict) -> dict:
    """Architectures in the mapping / built / fast / eager / excluded / with an error or unequal."""
    built = {t: r for t, r in rows.items() if "excluded" not in r and "engine" in r}
    return {"mapping": len(rows), "built": len(built),
            "fast": sum(r["engine"] == "fast" for r in built.values()),
            "eager": sum(r["engine"] == "eager" for r in built.values()),
            "excluded": sum("excluded" in r for r in rows.values()),
            "errors": sum("error" in r for r in rows.values()),
            "unequal": sum(r.get("equal") is False for r in built.values()),
            "fast_by_name_equal": sum(r.get("fast_by_name", {}).get("equal") is True for r in built.values())}


def _by_name(row: dict) -> str:
    f = row.get("fast_by_name", {})
    if f.get("equal"):
        return "equal"
    if f.get("refused"):
        return "refused"
    return ("error: " + f["error"] if f.get("error") else "differs: " + f.get("differs", "")).replace("|", "/")[:120]


def markdown(doc: dict) -> str:
    """The lab's table: every architecture, what auto did and what the fast engine by name did."""
    lines = [f"# What stitch_engine='auto' does on transformers' zoo ({doc['device']}, transformers "
             f"{doc['transformers']}, torch {doc['torch']}, {doc['date']})", "", f"Counts: {doc['counts']}", "",
             "| model_type | auto | equal | speed-up vs eager | fast by name | reason / error |",
             "|---|---|---|---|---|---|"]
    for t, r in sorted(doc["architectures"].items()):
        if "excluded" in r:
            lines.append(f"| {t} | excluded | | | | {r['excluded']} |")
            continue
        why = (r.get("error") or r.get("reason") or "").replace("|", "/")
        lines.append(f"| {t} | {r.get('engine', '?')} | {r.get('equal', '')} | {r.get('speedup_vs_eager', '')} | "
                     f"{_by_name(r)} | {why} |")
    return "\n".join(lines) + "\n"


def gpu_families(proven) -> list[str]:
    """docs/models.md's GPU section: what ``"auto"`` does on each GPU family (:mod:`hf_rstitch.fast.capabilities`)."""
    from hf_rstitch.fast import capabilities

    lines = ["## What each GPU gets", "",
             "On a GPU of a proven compute capability the architectures marked **fast** run the fast engine at once. "
             "On any other GPU the first `\"auto\"` call of a pair proves the fast engine on that machine: both "
             "engines teacher-forced over the call's own prompt, their log-probabilities, entropies and most likely "
             "tokens compared within the dtype's tolerance; passed, the fast engine from then on (the proof stored "
             "under the Hugging Face cache: `rstitch env` lists it), failed, the eager engine "
             "([The fast engine](fast-engine.md#every-gpu-which-features-run-where)). `HF_RSTITCH_PROVE=off` keeps "
             "the eager engine on unproven GPUs. Features each GPU lacks are off with a working path below them; "
             "every Triton kernel is compile-checked for each of these targets (`tools/kernel_targets.py`).", "",
             "| GPU | compute capability | `\"auto\"` | GPU features the fast engine uses |", "|---|---|---|---|"]
    for cap, name in sorted(capabilities.TARGETS.items()):
        feats = [f for f, feature in capabilities.FEATURES.items() if feature.on(cap) and not
                 feature.used_by.startswith("nothing")]
        runs = "fast (proven)" if cap in proven else "fast after its proof on the machine"
        if not capabilities.FEATURES["bfloat16"].on(cap):
            runs += "; load models in float16 (no bfloat16)"
        lines.append(f"| {name} | {cap[0]}.{cap[1]} | {runs} | {', '.join(feats) or 'none of the table'} |")
    return lines + ["", "## Architectures", ""]


def docs_table(doc: dict) -> str:
    """docs/models.md: the users' lookup table (what ``generate`` runs for a model_type on a GPU)."""
    from hf_rstitch.fast.support import PROVEN, PROVEN_CAPABILITIES

    caps = ", ".join(f"{a}.{b}" for a, b in sorted(PROVEN_CAPABILITIES))
    lines = ["# Models: which engine runs yours", "",
             "A `generate` call that names no `stitch_engine` runs `\"auto\"`: the fast engine (static caches, CUDA "
             "graphs) for the architectures below marked **fast**, on GPUs of compute capability " + caps + " (on other "
             "GPUs after a proof on the machine: below), "
             "and the eager engine for everything else, the reason logged once on the `hf_rstitch.fast` logger. "
             "Look your model up by its `config.model_type`. `stitch_engine=\"fast\"` tries the fast engine on "
             "any architecture it can hold (the *fast by name* column: its tokens against the eager engine's on "
             "tiny random pairs), and `stitch_engine=\"default\"` always runs the eager engine.", "",
             *gpu_families(PROVEN_CAPABILITIES),
             f"Source: `benchmarks/zoo.py` on {doc['device']} (transformers {doc['transformers']}, torch "
             f"{doc['torch']}, {doc['date']}); the CPU half of the proof is `tests/zoo` (CI). Proven set: "
             "`hf_rstitch.fast.support.PROVEN`.", "",
             "| model_type | auto runs | fast by name | why not fast |", "|---|---|---|---|"]
    for t, r in sorted(doc["architectures"].items()):
        if "excluded" in r:
            lines.append(f"| {t} | not tested | | {r['excluded']} |")
            continue
        reason = r.get("reason") or ""
        fast = t in PROVEN and (r.get("engine") == "fast" or "graphs need CUDA" in reason)
        if t in PROVEN and "sliding window on every layer" in reason:
            runs, why = "**fast** without a window", "with `sliding_window` set (the zoo's config): " + _short(reason)
        elif t in PROVEN and "not been proven equal" in reason and r.get("fast_by_name", {}).get("equal") is True:
            runs, why = "**fast** (by name)", ("proven in this run by name, with auto's configuration; added to the "
                                               "proven set after it, so auto itself ran the eager engine here")
        else:
            runs, why = ("**fast**" if fast else "eager"), ("" if fast else _short(reason))
        lines.append(f"| {t} | {runs} | {_by_name(r)} | {why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _short(reason: str) -> str:
    if "has not been proven equal on" in reason:
        return "not proven on the fast engine yet"
    for prefix in ("the llm: ", "the slm: ", "the llm ", "the slm "):
        if reason.startswith(prefix):
            return reason[len(prefix):]
    return reason


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--workers", type=int, default=4, help="worker processes (one GPU shared)")
    p.add_argument("--timeout", type=float, default=150, help="seconds one architecture may take")
    p.add_argument("--budget", type=float, default=0, help="seconds for the whole run (0: none); the rest is "
                   "recorded as not run")
    p.add_argument("--only", default="", help="comma-separated model_types (default: the whole mapping)")
    p.add_argument("--out", default="", help="result stem (default benchmarks/results/zoo_<device>)")
    p.add_argument("--docs", default="", help="also write the users' table here (e.g. docs/models.md)")
    p.add_argument("--update", default="", help="an earlier result (JSON) of the same device: its rows are kept "
                   "and the --only architectures run again over them (after a change to PROVEN, say)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        return serve(args.device)
    import torch

    from lab import RESULTS, environment, write_result
    from zoo_models import zoo

    from hf_rstitch.fast.support import PROVEN

    types = [t for t in args.only.split(",") if t] or zoo()
    types.sort(key=lambda t: t not in PROVEN)  # the proven ones first: a --budget that runs out loses the rest
    env = environment([args.device])
    name = env["devices"][0] if args.device != "cpu" else "cpu"
    stem = Path(args.out) if args.out else RESULTS / f"zoo_{name.lower().replace(' ', '_').replace('-', '_')}"
    doc = {"device": name, **env, "workers": args.workers,
           "capability": ".".join(map(str, torch.cuda.get_device_capability())) if args.device == "cuda" else None,
           "note": f"timings with {args.workers} worker processes sharing the device",
           "counts": {}, "architectures": {}}

    earlier = json.loads(Path(args.update).read_text()) if args.update else None
    if earlier is not None and earlier["device"] != name:
        raise SystemExit(f"--update {args.update} was measured on {earlier['device']}, not {name}: run the whole zoo")

    def write(rows):
        rows = {**(earlier["architectures"] if earlier else {}), **rows}
        doc["architectures"], doc["counts"] = dict(sorted(rows.items())), counts(rows)
        # candidates for hf_rstitch.fast.support.PROVEN (where this run is on a GPU and tests/zoo passes)
        doc["provable"] = sorted(t for t, r in rows.items() if r.get("fast_by_name", {}).get("equal") is True)
        write_result(stem, doc, markdown(doc))

    rows = run_all(types, args.device, args.workers, args.timeout, write, args.budget)
    rows = doc["architectures"]
    if args.docs:
        Path(args.docs).write_text(docs_table(doc))
    print(json.dumps({"counts": doc["counts"], "provable": doc["provable"],
                      "proven_but_not_provable_here": sorted(PROVEN & set(rows) - set(doc["provable"]))}))


if __name__ == "__main__":
    main()
