"""Tensor parallelism on CPU: two gloo ranks under torchrun equal the single-process run.

transformers 5.17 shards a model on CPU (``tp_plan="auto"`` builds a CPU device mesh over gloo),
so the whole TP path -- DTensor weights, all-reduces, the all-gathered logits -- runs here;
only NCCL and per-rank GPUs are left to the GPU tests.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)

from multigpu.cases import stitched, tiny_pair, write_case

WORKER = Path(__file__).with_name("tp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(case_dir: Path, nproc: int = 2, cuda: bool = False) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(WORKER), str(case_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((case_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def reference(llm, slm, case: dict, device: str = "cpu") -> dict:
    """The single-process outputs; the prompt on ``device``, whose generator samples (as on the ranks)."""
    ids = torch.tensor(case["ids"], device=device)
    greedy = stitched(llm, slm, ids, case["tau"])
    batch = stitched(llm, slm, torch.tensor(case["batch_ids"], device=device), case["tau"],
                     torch.tensor(case["batch_mask"], device=device), eos_token_id=case["eos"], pad_token_id=2)
    torch.manual_seed(case["seed"])
    sampled = llm.generate(ids, assistant_model=slm, stitch_threshold=case["tau"], max_new_tokens=case["n_new"],
                           do_sample=True, top_k=0)
    return {"greedy": greedy.sequences.tolist(), "greedy_roles": [str(r) for r in greedy.stitch.roles],
            "batch": batch.sequences.tolist(), "batch_roles": [[str(r) for r in t.roles] for t in batch.stitch],
            "sampled": sampled.tolist()}


def check_ranks(ranks: list[dict], ref: dict) -> None:
    for out in ranks:
        assert out["llm"].startswith(f"tensor-parallel x{len(ranks)}")
        assert out["local_q_proj_rows"] < 64  # q_proj really is sharded
        for key in ("greedy", "greedy_roles", "batch", "batch_roles", "sampled"):
            assert out[key] == ref[key], (out["rank"], key)
        assert "different prompts" in out["skewed_prompt_error"]
        assert "same way" in out["skewed_seed_error"] and "torch.manual_seed" in out["skewed_seed_error"]
    b = ref["batch"]
    assert b[0][-1] == 2 and b[1][-1] != 2, "row 0 should finish early (padded) and row 1 run to the end"


@pytest.mark.slow
def test_two_gloo_ranks_equal_single_process(tmp_path):
    llm, slm = tiny_pair()
    case = write_case(tmp_path, llm, slm)
    ref = reference(llm, slm, case)
    check_ranks(run_ranks(tmp_path), ref)
