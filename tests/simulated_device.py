"""A GPU's routing decisions simulated on the CPU: the decisions a step's lanes return count as on a device
(:func:`hf_rstitch.decode.loop.on_device`) until the host reads them, so that the code paths a GPU takes where
the LLM's hand-back decisions have not reached the host run on CPU lanes too."""

from __future__ import annotations

from hf_rstitch.batching import executor
from hf_rstitch.decode import loop

MARK = "_rstitch_on_device"  # set on the decisions tensor a step returned; the host's read of it is a new tensor


def simulate_a_device(monkeypatch, module, name: str = "run_step") -> None:
    """``module.name`` (the step function a loop or engine calls) marks its decisions; ``on_device`` answers True for
    marked tensors, everywhere it is asked."""
    step = getattr(module, name)

    def marked(*args, **kwargs):
        out = step(*args, **kwargs)
        if out.back is not None:
            setattr(out.back, MARK, True)
        return out

    def on_device(decisions) -> bool:
        return decisions is not None and getattr(decisions, MARK, False)

    monkeypatch.setattr(module, name, marked)
    for where in (loop, executor):
        monkeypatch.setattr(where, "on_device", on_device)
