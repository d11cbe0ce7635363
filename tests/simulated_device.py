"""A GPU's routing decisions simulated on the CPU: the decisions a step's lanes return count as on a device
(:func:`hf_rstitch.decode.loop.on_device`) until the host reads them, so that the code paths a GPU takes where
the LLM's hand-back decisions have not reached the host run on CPU lanes too."""

from __future__ import annotations

from hf_rstitch.batching import executor
from hf_rstitch.decode import loop

MARK = "_rstitch_on_device"  # set on the decisions tensor a step returned; the host's read of it is a new tensor


def simulate_a_device(monkeypatch, module, *names: str) -> None:
    """The functions ``names`` of ``module`` (the step functions a loop or engine calls: ``run_step``, the loop's
    ``settle``) mark the decisions they return; ``on_device`` answers True for marked tensors, everywhere it is
    asked."""
    def marking(step):
        def marked(*args, **kwargs):
            out = step(*args, **kwargs)
            if out.back is not None:
                setattr(out.back, MARK, True)
            return out
        return marked

    def on_device(decisions) -> bool:
        return decisions is not None and getattr(decisions, MARK, False)

    for name in names or ("run_step",):
        monkeypatch.setattr(module, name, marking(getattr(module, name)))
    for where in (loop, executor):
        monkeypatch.setattr(where, "on_device", on_device)
