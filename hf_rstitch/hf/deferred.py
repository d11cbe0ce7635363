"""Patch ``generate`` when transformers loads, so ``import hf_rstitch`` stays cheap.

``import hf_rstitch`` promises stitched decoding on ``GenerationMixin.generate``. Patching needs
transformers (and so torch), which a CLI ``--help`` or a torch-free submodule
(``hf_rstitch.latency``, the config dataclasses) never loads. So the patch is applied at once if
``transformers.generation.utils`` is already imported, and otherwise by a one-shot import hook
right after that module executes -- before any model can call ``generate``. This module imports
nothing heavy and makes no routing decision.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

TARGET = "transformers.generation.utils"  # defines GenerationMixin


def _patch_now() -> None:
    try:
        from .logs import bridge
        from .patch import patch
        from .persist import hook

        patch()
        hook()  # stitching settings on a generation config survive save_pretrained / from_pretrained
        bridge()  # transformers.logging.set_verbosity_* reaches hf_rstitch's messages
    except Exception as err:  # never break the user's transformers import
        warnings.warn(f"hf_rstitch could not patch GenerationMixin.generate ({type(err).__name__}: {err}); "
                      "call hf_rstitch.patch() to see the full error, or use "
                      "custom_generate=hf_rstitch.stitched_decode instead.", RuntimeWarning, stacklevel=2)


class _PatchAfterLoad(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of :data:`TARGET` so the patch runs after it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; the real finders answer below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch_now()

        spec.loader.exec_module = exec_then_patch  # this spec's own loader instance
        return spec


def patch_when_transformers_loads() -> None:
    """Patch now if transformers' generation module is loaded, else as soon as it is (idempotent)."""
    if TARGET in sys.modules:
        _patch_now()
    elif not any(isinstance(f, _PatchAfterLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterLoad())
