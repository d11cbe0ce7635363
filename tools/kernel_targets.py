"""Compile every Triton kernel a fast lane can pick for every GPU target, on a machine without a GPU.

    PYTHONPATH=$PWD python tools/kernel_targets.py                      # all targets, all launches
    PYTHONPATH=$PWD python tools/kernel_targets.py --targets 75 90 --every 20 --out /tmp/k.json

The question: does each kernel build for the GPUs users have (:data:`hf_rstitch.fast.capabilities.TARGETS`:
sm75 ... sm120), so that a kernel that cannot build for one is caught here, not on a user's machine? For each
target the lanes' launch functions are called (:mod:`kernel_launches`: every tuned configuration of the shipped
tables, every candidate of the search spaces, the other kernels at the sizes lanes use) with Triton's driver
replaced by one that names the target and compiles nothing, under :func:`capabilities.assume` of the target --
so the launches make the choices the lanes make there (no programmatic dependent launch below 9.0, no bfloat16
below 8.0) -- and the SM count of that GPU (attention and read-out plans depend on it). Each distinct launch
(kernel, argument types, constexprs, options) is then compiled with ``triton.compile(..., target=GPUTarget(...))``
down to the GPU binary (Triton's ptxas; ``ptxas-blackwell`` for 10.0 and 12.0).

Writes ``benchmarks/results/kernel_targets.json``: for each kernel variant and target "built" or the reason it
did not build (or why the lanes never launch it there); prints one compact JSON last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver as triton_driver
from triton.runtime.jit import JITFunction

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_launches  # noqa: E402
from hf_rstitch.fast import capabilities  # noqa: E402
from hf_rstitch.fast.kernels import decode_attention, fused_entropy  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "kernel_targets.json"
SMS = {(7, 5): 40, (8, 0): 108, (8, 6): 84, (8, 9): 128, (9, 0): 132, (10, 0): 148, (12, 0): 170}
OPTIONS = ("num_warps", "num_ctas", "num_stages", "maxnreg", "launch_pdl", "enable_fp_fusion",
           "launch_cooperative_grid")


class _TargetDriver:
    """Triton's driver as the launch path sees it, for a GPU of ``capability`` that is not there."""

    def __init__(self, capability):
        self.target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.target.arch  # a device per target: each gets its own binder (backend) in a kernel's caches

    def get_current_stream(self, device=None):
        return 0


class Launch:
    """One distinct launch: the kernel and what it was specialized on."""

    def __init__(self, fn, signature, constexprs, attrs, options):
        self.fn, self.signature, self.constexprs, self.attrs = fn, signature, constexprs, attrs
        self.options = {k: getattr(options, k) for k in OPTIONS if hasattr(options, k)}

    @property
    def name(self) -> str:
        """Kernel, argument types, constexprs and launch options, PDL left out (it follows the target)."""
        consts = ",".join(f"{'.'.join(map(str, k)) if isinstance(k, tuple) else k}={v}"
                          for k, v in sorted(self.constexprs.items(), key=str) if not str(k).endswith("PDL")
                          and not isinstance(v, JITFunction))
        types = ",".join(str(v) for v in self.signature.values() if v != "constexpr")
        opts = ",".join(f"{k}={v}" for k, v in self.options.items() if k != "launch_pdl" and v is not None)
        return f"{self.fn.__name__}({types})[{consts}]{{{opts}}}"


@contextlib.contextmanager
def recording(capability, seen: dict):
    """Within the block, kernel launches are recorded into ``seen`` (name -> :class:`Launch`), not compiled nor
    run, as on a GPU of ``capability``."""
    original, active = JITFunction._do_compile, triton_driver._active

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        launch = Launch(self, signature, constexprs, attrs, options)
        seen.setdefault(launch.name, launch)
        return None

    sms = lambda device: SMS.get(tuple(capability), 100)  # noqa: E731
    saved = decode_attention._sm_count, fused_entropy._sm_count
    JITFunction._do_compile = record
    triton_driver.set_active(_TargetDriver(capability))
    decode_attention._sm_count = fused_entropy._sm_count = sms
    try:
        with capabilities.assume(tuple(capability)):
            yield seen
    finally:
        JITFunction._do_compile = original
        triton_driver._active = active
        decode_attention._sm_count, fused_entropy._sm_count = saved


def launches(capability, every: int = 1) -> tuple[dict, dict]:
    """``(launches, skipped)`` for a GPU of ``capability``: every distinct launch of
    :func:`kernel_launches.launch_sets` (of every ``every``-th set), and the sets the lanes never run there
    (set name -> why), e.g. bfloat16 below 8.0."""
    seen, skipped = {}, {}
    with recording(capability, seen):
        for i, (name, dtype, call) in enumerate(kernel_launches.launch_sets()):
            if i % every:
                continue
            if dtype == torch.bfloat16 and not capabilities.has("bfloat16", "cuda"):
                skipped[name] = "not launched: bfloat16 needs compute capability 8.0 (models run in float16)"
                continue
            call()
    return seen, skipped


def build(launch: Launch, capability) -> str:
    """"built", or why not (the compiler's first lines)."""
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    src = ASTSource(launch.fn, launch.signature, launch.constexprs, launch.attrs)
    try:
        kernel = triton.compile(src, target=target, options=dict(launch.options))
    except Exception as err:  # noqa: BLE001 - the reason is the result
        lines = [line for line in str(err).splitlines() if line.strip()]
        return f"{type(err).__name__}: " + " | ".join(lines[-3:])[:400]
    return "built" + (" (pdl)" if launch.options.get("launch_pdl") else "") if kernel.asm.get("cubin") else "no cubin"


def run(targets, every: int = 1, jobs: int = 1, log=print, out: Path | None = None) -> dict:
    """The result document: kernel variant -> target -> "built" / reason (compiles in ``jobs`` threads: Triton
    releases the interpreter lock while it lowers and assembles)."""
    table, counts = {}, {}
    for capability in targets:
        start = time.perf_counter()
        seen, skipped = launches(capability, every)
        label = f"sm{capability[0]}{capability[1]}"
        for name, why in skipped.items():
            table.setdefault(f"[set] {name}", {})[label] = why
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            results = pool.map(lambda launch: build(launch, capability), seen.values())
            for name, result in zip(seen, results):
                table.setdefault(name, {})[label] = result
        built = sum(1 for name in seen if table[name][label].startswith("built"))
        counts[label] = {"launches": len(seen), "built": built, "failed": len(seen) - built,
                         "sets_not_launched": len(skipped), "seconds": round(time.perf_counter() - start, 1)}
        log(json.dumps({label: counts[label]}))
        doc = {"environment": {"triton": triton.__version__, "torch": torch.__version__, "host": platform.node(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "every": every},
               "targets": counts, "kernels": dict(sorted(table.items()))}
        if out is not None:  # after each target: a long run keeps what it has
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", type=int, default=[a * 10 + b for a, b in sorted(capabilities.TARGETS)],
                        help="compute capabilities as 75, 80, ... (default: every GPU of capabilities.TARGETS)")
    parser.add_argument("--every", type=int, default=1, help="every EVERY-th launch set only (a quick check)")
    parser.add_argument("--out", default=str(OUT), help="result JSON")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile threads")
    args = parser.parse_args(argv)
    doc = run([(t // 10, t % 10) for t in args.targets], args.every, args.jobs, out=Path(args.out))
    failed = {k: v for k, row in doc["kernels"].items() for t, v in row.items() if not v.startswith(("built", "not "))}
    print(json.dumps({"out": args.out, "targets": doc["targets"], "failed": len(failed)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
