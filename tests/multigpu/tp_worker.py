"""One rank of the tensor-parallel tests: ``torchrun --nproc-per-node 2 tp_worker.py CASE_DIR``.

Loads the LLM with transformers' tensor parallelism (``tp_plan="auto"``; gloo on CPU, NCCL on
CUDA), a whole SLM on this rank's device, runs the requests of ``CASE_DIR/case.json`` and writes
``CASE_DIR/rank<r>.json``. It also calls the placement check with a different prompt and with
different sampling seeds on the ranks, and records the errors it raises.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.hf.placement import check_placement, describe


def load_tp(path: Path, dtype):
    try:
        from transformers.distributed import DistributedConfig

        config = DistributedConfig(tp_plan="auto")
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=config)
    except ImportError:  # transformers before DistributedConfig
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, tp_plan="auto")


def error_of(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def main(root: Path) -> None:
    case = json.loads((root / "case.json").read_text())
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    llm = load_tp(root / "llm", torch.float64).eval()
    slm = AutoModelForCausalLM.from_pretrained(root / "slm", dtype=torch.float64).to(device).eval()
    rank = torch.distributed.get_rank()
    common = dict(assistant_model=slm, stitch_threshold=case["tau"], max_new_tokens=case["n_new"],
                  return_dict_in_generate=True)

    ids = torch.tensor(case["ids"], device=device)
    greedy = llm.generate(ids, do_sample=False, **common)
    b_ids, b_mask = torch.tensor(case["batch_ids"], device=device), torch.tensor(case["batch_mask"], device=device)
    batch = llm.generate(b_ids, attention_mask=b_mask, do_sample=False, eos_token_id=case["eos"], pad_token_id=2,
                         **common)
    torch.manual_seed(case["seed"])  # the same seed on every rank: each rank samples its own copy of the token
    sampled = llm.generate(ids, do_sample=True, top_k=0, **common)

    def skewed_prompt():
        check_placement(llm, slm, ids + rank)

    def skewed_seed():
        torch.manual_seed(case["seed"] + rank)
        check_placement(llm, slm, ids, do_sample=True)

    out = {
        "rank": rank, "world": torch.distributed.get_world_size(), "llm": describe(llm), "device": str(device),
        "local_q_proj_rows": int(llm.model.layers[0].self_attn.q_proj.weight.to_local().shape[0]),
        "greedy": greedy.sequences.tolist(), "greedy_roles": [str(r) for r in greedy.stitch.roles],
        "batch": batch.sequences.tolist(), "batch_roles": [[str(r) for r in t.roles] for t in batch.stitch],
        "sampled": sampled.sequences.tolist(),
        "skewed_prompt_error": error_of(skewed_prompt), "skewed_seed_error": error_of(skewed_seed),
    }
    (root / f"rank{rank}.json").write_text(json.dumps(out))
    torch.distributed.barrier()  # every rank has written its file
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the gloo teardown, which can abort ("terminate called without an active exception") when loaded


if __name__ == "__main__":
    main(Path(sys.argv[1]))
