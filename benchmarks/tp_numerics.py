"""Is a tensor-parallel bf16 LLM as accurate as the one-device bf16 LLM? (issue #10)

    torchrun --nproc-per-node 2 benchmarks/tp_numerics.py --save-dir /tmp/mg --out benchmarks/results

Run ``multigpu_bench.py --save-dir DIR`` first. Every rank loads the saved LLM with transformers'
tensor-parallel plan (bf16); rank 0 also loads it whole on its device twice: in bf16 (the
one-device run) and upcast to float32 (the same weights, exact arithmetic to bf16's eyes). All
three run teacher-forced over the reference sequence of ``reference.json``. Rank 0 reports, for
the generated positions, each bf16 run's distance to float32 (max and median |logit difference|,
argmax agreement) and the distance between the two bf16 runs.

Reading it: greedy tokens of two bf16 runs that sum in different orders can part at near-ties.
If the TP run is about as far from float32 as the one-device run is, the split is numerically
sound and a diverging greedy output is rounding, not a bug. (``tests/multigpu`` checks exact
equality of TP and one-device runs in float64.)
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

from multigpu_bench import forced_logits
from multigpu_tp_worker import load_tp


def distance(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs().amax(-1)  # per position
    return {"max_abs": float(d.max()), "median_abs": float(d.median()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save-dir", required=True, help="where multigpu_bench.py --save-dir put the pair")
    ap.add_argument("--out", required=True, help="folder for tp_numerics_<device>.json")
    args = ap.parse_args(argv)
    save = Path(args.save_dir)
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    ref = json.loads((save / "reference.json").read_text())
    seq = ref["run"]["sequence"]
    prompt_len = len(seq) - len(ref["run"]["top_ids"])

    tp = load_tp(save / "llm").eval()
    tp_logits = forced_logits(tp, seq, prompt_len).cpu()
    del tp
    if dist.get_rank() == 0:
        one = AutoModelForCausalLM.from_pretrained(save / "llm", dtype=torch.bfloat16, device_map={"": device}).eval()
        one_logits = forced_logits(one, seq, prompt_len).cpu()
        one = one.float()  # the same bf16 weights, float32 arithmetic
        exact = forced_logits(one, seq, prompt_len).cpu()
        del one
        margin = exact.topk(2).values
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        result = {
            "device": name, "world": dist.get_world_size(), "torch": torch.__version__,
            "positions": int(exact.shape[0]),
            "fp32_median_top2_margin": float((margin[:, 0] - margin[:, 1]).median()),
            "fp32_median_abs_logit": float(exact.abs().median()),
            "one_device_bf16_vs_fp32": distance(one_logits, exact),
            "tensor_parallel_bf16_vs_fp32": distance(tp_logits, exact),
            "tensor_parallel_vs_one_device_bf16": distance(tp_logits, one_logits),
        }
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        (out / f"tp_numerics_{slug}_x{result['world']}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"median |dlogit| vs fp32: one device {result['one_device_bf16_vs_fp32']['median_abs']:.4g}, "
              f"tensor-parallel {result['tensor_parallel_bf16_vs_fp32']['median_abs']:.4g}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
