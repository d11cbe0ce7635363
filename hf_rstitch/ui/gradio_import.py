"""Gradio, imported without the work the app never uses: the page is served sooner.

``import gradio`` (6.x) costs about 7 CPU seconds on the 2-core machine the app's startup is measured on
(``benchmarks/ui_startup.py``), and about 40% of that serves Gradio's own development only: every component class
regenerates its type stub as it is defined (``gradio.component_meta.create_or_modify_pyi`` reads and parses the
class's source file, renders a template and compares it with the ``.pyi`` beside it). The app reads no stubs.

:func:`gradio` imports Gradio with that step skipped when it is the first to import Gradio, and as usual otherwise
(a notebook that imported it already; a Gradio without ``create_or_modify_pyi`` is imported unchanged). It changes
no behaviour of a component.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

STUBS = "gradio.component_meta"


class _SkipStubs(importlib.abc.MetaPathFinder):
    """Finds ``gradio.component_meta`` as usual and, once it has run, makes its stub writer do nothing."""

    def find_spec(self, name, path, target=None):
        if name != STUBS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if callable(getattr(module, "create_or_modify_pyi", None)):
                module.create_or_modify_pyi = _no_stub

        spec.loader.exec_module = exec_module
        return spec


def _no_stub(*args, **kwargs) -> None:
    """In place of ``create_or_modify_pyi``: no type stub (the app never reads one)."""


def gradio() -> ModuleType:
    """The ``gradio`` module (imported here without its type stubs when no one has imported it yet)."""
    if "gradio" in sys.modules:
        return sys.modules["gradio"]
    finder = _SkipStubs()
    sys.meta_path.insert(0, finder)
    try:
        import gradio as gr
    finally:
        sys.meta_path.remove(finder)
    return gr
