"""The shipped Triton kernels of this GPU kind: every kernel the engine's first calls on the benchmark pairs build.

    PYTHONPATH=$PWD python tools/triton_kernels_asset.py            # writes the shipped archive
    PYTHONPATH=$PWD python tools/triton_kernels_asset.py --out-dir $OUT --pairs qwen2-7b/qwen2-1.5b

The question: which compiled kernels a fresh machine of this kind (same GPU, torch and Triton) can load instead of
building -- Triton's own cache entries, shipped in the package (:mod:`hf_rstitch.fast.kernels.triton_cache`).
One process with an empty Triton cache (``TRITON_CACHE_DIR``) and the shipped GEMV tuning table only (as a fresh
machine reads it) runs, for each pair of :data:`engine_shapes.PAIRS` made with one layer (kernels depend on the
layers' shapes, not their number), a first ``stitch_engine="auto"``-configured call at batch 1 for each of
``--capacities`` (the split attention's plan depends on the cache's length: 1024 to 8192 tokens cover its
variants at batch 1), every graph captured; then packs the cache it filled.

Writes ``hf_rstitch/assets/triton_kernels/<gpu>.{tar.gz,json}`` (``--asset-dir``; replaced whole) and a copy
under ``--out-dir``; prints one compact JSON last (entries, bytes, seconds). The index records the kernel code
it was made from; ``tools/check_assets.py`` (``make check-assets``) says where it is stale.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import sys

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the lab: model shapes, helpers
import lab  # noqa: E402
from engine_shapes import PAIRS, build  # noqa: E402


def first_calls(pair: str, capacities: list[int], max_batch: int, device: str, tiny: bool) -> int:
    """Run the first call of ``pair`` (one-layer models) at each capacity, with every graph captured; returns the
    graphs captured."""
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.fast import AUTO, FastConfig, FastEngine

    big, small = pair.split("/")
    llm, slm = build(big, device, seed=0, layers=1, tiny=tiny), build(small, device, seed=1, layers=1, tiny=tiny)
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    ids = lab.prompt_ids(vocab, 16, device)
    config = AUTO if not tiny else FastConfig(warm_up=True, graphs=False, max_bucket=8)  # eager on CPU
    graphs = 0
    for capacity in capacities:
        engine = FastEngine(config, capacity=capacity, max_batch=max_batch)
        llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                     stitch_policy=ReplayPolicy(["slm", "llm", "slm", "llm"]), stitch_engine=engine, max_new_tokens=4,
                     do_sample=False)
        lab.sync(device)
        graphs += engine.graph_count()
    return graphs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", nargs="+", default=PAIRS, choices=PAIRS)
    ap.add_argument("--capacities", nargs="+", type=int, default=[1024, 2048, 4096, 8192],
                    help="cache lengths (tokens) whose split attention is built")
    ap.add_argument("--max-batch", type=int, default=1, help="lanes of this many rows")
    ap.add_argument("--budget-s", type=float, default=600, help="no pair starts past this many seconds (the "
                                                                "archive holds the pairs run)")
    ap.add_argument("--asset-dir", default=None, help="where the archive goes (default: the package's)")
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU, a fake cache packed: checks "
                                                                "the script, builds nothing")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="triton_kernels_"))
    os.environ.update(TRITON_CACHE_DIR=str(scratch / "triton"),  # empty: every kernel is built and lands here
                      TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
                      HF_RSTITCH_SHIPPED_KERNELS="off",  # not seeded from an earlier archive
                      HF_RSTITCH_TUNING_CACHE="off")  # the shipped tuning table only: a fresh machine's choices
    import hf_rstitch  # noqa: F401  (patches generate)
    from hf_rstitch.fast.kernels import triton_cache, tuning_cache
    from hf_rstitch.fast.patches import products

    products.TABLE = tuning_cache.TuningTable(None)  # memory only (made at import, maybe before the settings above)

    device = "cpu" if args.dry_run_cpu else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu dry run"
    stem = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    asset_dir = Path(args.asset_dir) if args.asset_dir else triton_cache.SHIPPED_DIR
    machine = triton_cache.identity(device) if device == "cuda" else "cpu dry run"
    if args.dry_run_cpu:  # nothing compiles on CPU: a one-entry stand-in shows the packing works
        (scratch / "triton" / "DRYRUN").mkdir(parents=True, exist_ok=True)
        (scratch / "triton" / "DRYRUN" / "dry.json").write_text("{}")
    seconds, began, about = {}, time.perf_counter(), None
    for pair in args.pairs:
        start = time.perf_counter()
        if start - began > args.budget_s:
            print(json.dumps({"pair": pair, "skipped": "time budget"}), flush=True)
            continue
        graphs = first_calls(pair, args.capacities, args.max_batch, device, args.dry_run_cpu)
        seconds[pair] = round(time.perf_counter() - start, 1)
        made = {"made_by": "tools/triton_kernels_asset.py", "pairs": list(seconds),
                "capacities": args.capacities, "max_batch": args.max_batch}
        about = ship(scratch / "triton", machine, stem, asset_dir, made, Path(args.out_dir))  # a cut-short run keeps it
        print(json.dumps({"pair": pair, "seconds": seconds[pair], "graphs": graphs, "bytes": about["bytes"]}),
              flush=True)
    if about is None:
        raise SystemExit("no pair ran within --budget-s: nothing packed")
    built = sum(1 for p in (scratch / "triton").iterdir() if p.is_dir())
    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"device": name, "identity": machine, "cache_entries": built, "kernels": about["kernels"],
                      "shared_objects": about["shared_objects"], "bytes": about["bytes"],
                      "archive": str(asset_dir / about["archive"]), "seconds": seconds}))


def ship(cache: Path, machine: str, stem: str, asset_dir: Path, made: dict, out_dir: Path) -> dict:
    """Pack ``cache`` as the shipped archive under ``asset_dir`` and copy it under ``out_dir/triton_kernels``."""
    from hf_rstitch.fast.kernels import triton_cache

    about = triton_cache.pack(cache, machine, stem, asset_dir, made)
    out = out_dir / "triton_kernels"
    out.mkdir(parents=True, exist_ok=True)
    for suffix in (".tar.gz", ".json"):
        shutil.copy(asset_dir / f"{stem}{suffix}", out / f"{stem}{suffix}")
    return about

if __name__ == "__main__":
    main()
