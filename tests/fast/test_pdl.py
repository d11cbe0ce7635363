"""The switch for programmatic dependent launch of the fast engine's Triton kernels (hf_rstitch.fast.triton_support.PDL).
On a GPU the kernel tests check the kernels with it when it is switched on."""

import pytest
import torch


def test_programmatic_dependent_launch_switch(monkeypatch):
    """triton_support.PDL: 'off' by default (experimental); 'one-row' launches only one-row kernels with it; never off
    CUDA or under the interpreter; a wrong value says which values exist."""
    from hf_rstitch.fast import triton_support as g

    assert g.PDL == "off"
    cpu = torch.device("cpu")
    for mode in ("off", "one-row", "all"):
        monkeypatch.setattr(g, "PDL", mode)
        assert not g.pdl(cpu, 1) and not g.pdl(cpu, 8)
    monkeypatch.setattr(g, "PDL", "on")
    with pytest.raises(ValueError, match="one-row"):
        g.pdl(cpu, 1)
