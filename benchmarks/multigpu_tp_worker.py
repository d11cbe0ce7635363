"""Tensor-parallel part of the multi-GPU benchmark; one process per GPU under torchrun.

    torchrun --nproc-per-node 2 benchmarks/multigpu_tp_worker.py --out benchmarks/results --save-dir /tmp/mg

Run ``multigpu_bench.py --save-dir DIR`` first: it saves the random-weight pair and the 1-GPU
reference there. Every rank loads the LLM the way a user would (``from_pretrained`` with
``DistributedConfig(tp_plan="auto")``, transformers' tensor-parallel plan), its own whole SLM on
its GPU, and runs the same stitched generate on the same prompt and route. Rank 0 checks that
all ranks produced the same tokens, compares them with the 1-GPU reference, times LLM-only and
stitched decoding, and adds a ``tensor-parallel`` row to ``multigpu_<gpus>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from multigpu_bench import DTYPES, gpu_slug, markdown, measure, write


def load_tp(path: Path, dtype: torch.dtype = torch.bfloat16):
    try:
        from transformers.distributed import DistributedConfig

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=DistributedConfig(tp_plan="auto"))
    except ImportError:  # transformers without DistributedConfig (tp_plan was a from_pretrained argument)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, tp_plan="auto")


def same_on_all_ranks(values: list[int], device) -> bool:
    t = torch.tensor(values, device=device)
    both = torch.stack([t, -t])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(torch.equal(both[0], -both[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save-dir", required=True, help="where multigpu_bench.py --save-dir put the pair")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--repeats", type=int, default=None, help="default: as the 1-GPU run")
    args = ap.parse_args(argv)
    save = Path(args.save_dir)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    ref = json.loads((save / "reference.json").read_text())
    dtype = ref.get("dtype", "bfloat16")
    llm = load_tp(save / "llm", DTYPES[dtype]).eval()
    slm = AutoModelForCausalLM.from_pretrained(save / "slm", dtype=DTYPES[dtype], device_map={"": device}).eval()
    world = dist.get_world_size()
    slug = gpu_slug([str(device)] * world, dtype)
    result = json.loads((Path(args.out) / f"multigpu_{slug}.json").read_text())
    m = result["meta"]
    run_args = argparse.Namespace(new_tokens=m["new_tokens"], repeats=args.repeats or m["repeats"])

    ids = torch.tensor(ref["ids"], device=device)
    torch.manual_seed(0)  # greedy here; a sampled run would need the same seed on every rank
    row, mine = measure(f"tensor-parallel x{world}", llm, slm, ids, ref["route"], [device], run_args, ref,
                        barrier=dist.barrier)
    row["ranks_agree"] = same_on_all_ranks(mine["run"]["sequence"], device)
    if dist.get_rank() == 0:
        result["rows"] = [r for r in result["rows"] if not r["mode"].startswith("tensor-parallel")] + [row]
        write(result, Path(args.out))
        print(markdown(result))
        print(json.dumps({"slug": slug, "tp_row": row}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
