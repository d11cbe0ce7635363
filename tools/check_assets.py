"""Whether the package's shipped GPU assets were made from this checkout's kernel code (no GPU needed).

    PYTHONPATH=$PWD python tools/check_assets.py        # make check-assets; exit 1 where one is stale

Two assets serve a fresh machine's first call on the GPU kinds measured (docs/fast-engine.md, "Compiled kernels
ship too"):
- the GEMV tuner's choices, ``hf_rstitch/assets/gemv_tuning/<gpu>.json``;
- Triton's compiled kernels, ``hf_rstitch/assets/triton_kernels/<gpu>.{tar.gz,json}``.
Both name the kernel code they hold for, and both are safe when stale. A stale asset only stops serving: the
shapes are timed again, the kernels built again. So a kernel change needs both made again on each GPU kind:
- ``tools/gemv_tuning_table.py``;
- ``tools/triton_kernels_asset.py``.
This prints each asset's state: current, stale or unknown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def states(tuning_dir: Path | None = None, triton_dir: Path | None = None) -> list[tuple[str, str, str]]:
    """``(asset, state, how to make it again)`` for every shipped tuning table and Triton archive."""
    from hf_rstitch.fast.kernels import triton_cache, tuning_cache

    tuning_dir = tuning_cache.SHIPPED_DIR if tuning_dir is None else tuning_dir
    rows = [(f"gemv_tuning/{t.name}", tuning_cache.freshness(t), "tools/gemv_tuning_table.py")
            for t in sorted(tuning_dir.glob("*.json"))]
    rows += [(f"triton_kernels/{index.name}", triton_cache.freshness(about), "tools/triton_kernels_asset.py")
             for index, about in triton_cache.indices(triton_dir)]
    return rows


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = states()
    for asset, state, tool in rows:
        print(f"{asset}: {state}" + ("" if state == "current" else f" -- make it again on that GPU: "
                                                                   f"PYTHONPATH=$PWD python {tool}"))
    if not rows:
        print("no shipped GPU asset")
    return int(any(state != "current" for _, state, _ in rows))


if __name__ == "__main__":
    sys.exit(main())
