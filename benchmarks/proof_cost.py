"""What the on-machine proof costs and finds: the first ``"auto"`` call of a pair this GPU is not proven for.

    PYTHONPATH=.:benchmarks python benchmarks/proof_cost.py --out-dir $OUT [--profile generic]
    PYTHONPATH=.:benchmarks python benchmarks/proof_cost.py --dry-run-cpu --out-dir /tmp/p   # checks the script

The question (issue 51, item 4): on a GPU outside :data:`hf_rstitch.fast.support.PROVEN_CAPABILITIES`, the first
``generate`` of a pair proves the fast engine against the eager one over the prompt (:mod:`hf_rstitch.fast.proof`);
does it pass on the random Qwen2 7B / 1.5B pair in bfloat16, and what does it add to the first call (target: under
2 s)? The GPU is made unproven for this process (``PROVEN_CAPABILITIES`` emptied), the proofs go to a fresh folder.
Rows: the first call (lanes built, graphs captured, the probe), the probe alone (its stored ``seconds``), a second
call (no probe: the stored proof), and a call with ``HF_RSTITCH_PROVE=off`` in a fresh folder (eager: what an
unproven GPU ran before). Writes ``proof_cost_<gpu>.json``; prints one compact JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import torch

import lab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script, times nothing")
    lab.add_profile(ap)
    args = ap.parse_args()
    suffix = lab.apply_profile(args.profile)
    os.environ["HF_RSTITCH_PROOFS"] = tempfile.mkdtemp(prefix="rstitch_proofs_")
    import hf_rstitch  # noqa: F401  (patches generate)
    from hf_rstitch.fast import proof_store, support

    device = "cpu" if args.dry_run_cpu else "cuda"
    support.PROVEN_CAPABILITIES = frozenset()  # this GPU is not proven: "auto" proves it on the first call
    llm, slm = lab.random_pair("tiny" if args.dry_run_cpu else "qwen2", device)
    ids = lab.prompt_ids(slm.config.vocab_size, args.prompt, device)

    def call():
        return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_threshold=0.5,
                            max_new_tokens=args.new, min_new_tokens=args.new, return_dict_in_generate=True)

    rows = {}
    for name in ("first_call", "second_call"):
        seconds, out = lab.timed(call, device)
        rows[name] = {"seconds": round(seconds, 3), "engine": "fast" if llm.__dict__.get("_rstitch_fast_engines")
                      else "eager"}
    stored = proof_store.entries()
    os.environ["HF_RSTITCH_PROVE"] = "off"
    llm.__dict__.pop("_rstitch_fast_engines", None)
    rows["prove_off"] = {"seconds": round(lab.timed(call, device)[0], 3)}
    gpu = re.sub(r"[^a-z0-9]+", "_", lab.device_name(device).lower()).strip("_")
    doc = {"environment": lab.environment([device]), "args": vars(args), "rows": rows, "proofs": stored,
           "probe_s": stored[0]["seconds"] if stored else None, "passed": bool(stored) and stored[0]["passed"]}
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.out_dir) / f"proof_cost_{gpu}{suffix}.json").write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({"passed": doc["passed"], "probe_s": doc["probe_s"], "rows": rows,
                      "metrics": stored[0]["metrics"] if stored else None}, default=str))


if __name__ == "__main__":
    main()
