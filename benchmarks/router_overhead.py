"""Router overhead per call: median ms of one greedy router decision (log-softmax + argmax) on a
batch of 1 SLM hidden state, after warm-up; device-synchronised on CUDA. Prints a table row and
one JSON line (device, versions, date, numbers).

    python benchmarks/router_overhead.py [--device cuda] [--hidden 192 3584]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics

import torch

from hf_rstitch.router import Router
from lab import timed


def per_call_ms(router: Router, device: str, calls: int = 2000, warmup: int = 200) -> float:
    x = torch.randn(1, router.hidden_size, device=device)
    times = []
    with torch.no_grad():
        for i in range(calls + warmup):
            seconds, _ = timed(lambda: router.log_probs(x).argmax(-1), device)
            if i >= warmup:
                times.append(seconds * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, nargs="+", default=[192, 3584])
    args = ap.parse_args()
    torch.set_num_threads(1)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({platform.machine()}, 1 thread)"
    rows = []
    for hidden in args.hidden:
        router = Router(hidden).to(args.device).eval()
        ms = per_call_ms(router, args.device)
        rows.append({"hidden_size": hidden, "params": router.num_parameters(), "ms_per_call": ms})
        print(f"hidden {hidden:5d}  params {router.num_parameters():7d}  {ms:.3f} ms/call  ({name})")
    print(json.dumps({"device": name, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                      "results": rows}))


if __name__ == "__main__":
    main()
