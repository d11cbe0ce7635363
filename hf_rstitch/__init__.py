"""hf-rstitch: R-Stitch stitched decoding as a transformers generation plugin.

    import hf_rstitch  # registers stitched decoding on GenerationMixin.generate
    out = llm.generate(**inputs, assistant_model=slm, stitch_threshold=0.02, return_dict_in_generate=True)
    out.stitch_traces  # one trace per row: which model wrote each token, entropies, switches, per-call costs

Without the patch: ``llm.generate(..., custom_generate=hf_rstitch.stitched_decode,
stitch_slm=slm, stitch_threshold=0.02)``. ``hf_rstitch.unpatch()`` restores ``generate``.

Settings that travel with the LLM (``save_pretrained`` / ``push_to_hub``):
``hf_rstitch.configure(llm, threshold=0.005, slm="org/slm")``. Shipped files (the toy pair, its
router): ``hf_rstitch.shipped("llm")``, ``"slm"``, ``"router"``.

Importing the package is cheap: the public names below load on first use, and the ``generate``
patch (with the settings hook) is applied when transformers' generation module loads (at once if
it already has; see :mod:`hf_rstitch.hf.deferred`), so ``rstitch --help`` and the torch-free
submodules never load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .hf.deferred import patch_when_transformers_loads

__version__ = "0.1.0"

_LAZY = {  # public name -> module that defines it
    **dict.fromkeys(["EntropyPolicy", "RandomPolicy", "ReplayPolicy", "RoutingPolicy", "StepView"], ".core.policies"),
    "StepPolicy": ".core.policies_step",
    "Role": ".core.roles",
    **dict.fromkeys(["CallKind", "ForwardCall", "StitchTrace"], ".core.trace"),
    "stitched_decode": ".hf.decode",
    "StitchedGenerateOutput": ".hf.output",
    **dict.fromkeys(["is_patched", "patch", "unpatch"], ".hf.patch"),
    "configure": ".hf.settings",
    "shipped": ".resources",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


patch_when_transformers_loads()
