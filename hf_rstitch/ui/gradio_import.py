"""Gradio, imported without the work the app never uses: the page is served sooner.

``import gradio`` (6.x) costs about 7 CPU seconds on the 2-core machine the app's startup is measured on
(``benchmarks/ui_startup.py``), and about 40% of that serves Gradio's own development only: every component class
regenerates its type stub as it is defined (``gradio.component_meta.create_or_modify_pyi`` reads and parses the
class's source file, renders a template and compares it with the ``.pyi`` beside it). The app reads no stubs.

:func:`gradio` imports Gradio with that step skipped when it is the first to import Gradio, and as usual otherwise
(a notebook that imported it already; a Gradio without ``create_or_modify_pyi`` is imported unchanged). It changes
no behaviour of a component.

``gradio(server=True)`` (``rstitch ui``'s page process, which only serves) also refuses, for the rest of the
process, two imports Gradio and its HTTP client make only in case they are wanted, and guard with ``except
ImportError``: IPython (notebook magics, and "am I in a notebook?" checks at launch; a process that did not import
IPython before Gradio is no notebook) and trio (an async backend the server, on asyncio, never runs). Together about
5% of the import.

:func:`app_at_launch` skips two more: Gradio builds the server's FastAPI app (about 80 routes, each with pydantic
models) when a ``gr.Blocks`` is created, again when its ``with`` block ends, and a last time at ``launch``, which
serves the last one only. Within :func:`app_at_launch` the first two are not built (``blocks.app`` is None until
``launch``), which saves about 0.4 CPU seconds before the page is served.
"""

from __future__ import annotations

import contextlib
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


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses the imports of :data:`UNUSED` (and their submodules), as if they were not installed."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in UNUSED:
            raise ImportError(f"{name} is not imported in rstitch ui's page process (hf_rstitch.ui.gradio_import)",
                              name=name)
        return None


UNUSED = ("IPython", "trio")


def _no_stub(*args, **kwargs) -> None:
    """In place of ``create_or_modify_pyi``: no type stub (the app never reads one)."""


def gradio(server: bool = False) -> ModuleType:
    """The ``gradio`` module (imported here without its type stubs when no one has imported it yet); ``server``:
    this process only serves, and :data:`UNUSED` stays unimported (where it is not imported already)."""
    if "gradio" in sys.modules:
        return sys.modules["gradio"]
    if server and not any(name in sys.modules for name in UNUSED):
        sys.meta_path.insert(0, _Refuse())
    finder = _SkipStubs()
    sys.meta_path.insert(0, finder)
    try:
        import gradio as gr
    finally:
        sys.meta_path.remove(finder)
    return gr


@contextlib.contextmanager
def app_at_launch():
    """Build (and ``launch``) a ``gr.Blocks`` inside: its server app is built at ``launch`` only, not before."""
    from gradio.routes import App

    built = App.__dict__["create_app"]
    App.create_app = staticmethod(_no_app)
    try:
        yield
    finally:
        App.create_app = built


def _no_app(*args, **kwargs) -> None:
    """In place of ``App.create_app`` before ``launch``: no app (``launch`` builds the one it serves)."""
