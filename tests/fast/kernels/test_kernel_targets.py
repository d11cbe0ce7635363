"""Every Triton kernel the lanes can pick builds for every GPU target (tools/kernel_targets.py): a representative
subset cross-compiled for each capability of hf_rstitch.fast.capabilities.TARGETS on the CPU (Triton's compiler
with an explicit target, ptxas from its wheel), and the launches follow the capability table (no programmatic
dependent launch below 9.0, no bfloat16 launch below 8.0). The whole set: `python tools/kernel_targets.py`."""

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import kernel_targets  # noqa: E402

from hf_rstitch.fast import capabilities  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="records compiled launches")]
EVERY = 61  # launch sets: ~8 of the ~700 a target, spread over the tables, search spaces and other kernels


@pytest.mark.parametrize("capability", sorted(capabilities.TARGETS))
def test_a_subset_builds_for_every_target(capability):
    seen, skipped = kernel_targets.launches(capability, EVERY)
    assert seen, "no launch recorded"
    pdl = {launch.options.get("launch_pdl") for launch in seen.values()}
    assert (True in pdl) == capabilities.FEATURES["pdl"].on(capability)  # one-row launches use it where it exists
    if capability < (8, 0):
        assert skipped and all("bfloat16" in why for why in skipped.values())
        assert not any("bf16" in str(launch.signature) for launch in seen.values())
    else:
        assert not skipped
    failed = {name: why for name, launch in seen.items() if not (why := kernel_targets.build(launch, capability))
              .startswith("built")}
    assert not failed, failed
