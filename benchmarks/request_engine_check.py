"""GPU check: requests through RequestEngine (eager and fast lanes) equal their solo ``generate``.

Tiny seeded float32 Llama pairs (the CPU tests' models), 12 requests of different lengths through
4 rows, CUDA graphs on for the fast lanes. Prints one JSON line: per engine, requests whose tokens
equal the solo run's (float32 on a GPU may flip a near-tie; the CPU tests check equality in float64).
    python benchmarks/request_engine_check.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hf_rstitch  # noqa: E402,F401
from hf_rstitch.engine.requests import Request, RequestEngine  # noqa: E402
from hf_rstitch.fast import FastConfig  # noqa: E402
from tiny_models import make_pair, prompt  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    llm, slm = (m.float().to(a.device) for m in make_pair("llama"))
    prompts = [prompt(3 + (7 * i) % 13, seed=50 + i).to(a.device) for i in range(12)]
    taus = [0.3 + 0.05 * (i % 6) for i in range(12)]
    news = [4 + (5 * i) % 17 for i in range(12)]
    solo = [llm.generate(x, assistant_model=slm, stitch_threshold=t, max_new_tokens=n,
                         stitch_engine="default")[0, x.shape[1]:].tolist()
            for x, t, n in zip(prompts, taus, news)]
    out = {}
    for name, spec in (("default", "default"), ("fast", FastConfig())):
        engine = RequestEngine(llm, slm, max_batch=4, engine=spec, max_length=64)
        reqs = [Request(x[0].tolist(), max_new_tokens=n, stitch_threshold=t) for x, t, n in zip(prompts, taus, news)]
        done = engine.run(reqs)
        out[name] = sum(done[r.request_id].tokens == s for r, s in zip(reqs, solo))
    print(json.dumps({"device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else a.device,
                      "requests": len(prompts), "equal_to_solo": out}))


if __name__ == "__main__":
    main()
