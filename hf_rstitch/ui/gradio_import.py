"""Gradio, imported without the work the app never uses: the page is served sooner.

``import gradio`` (6.x) costs about 7 CPU seconds on the 2-core machine the app's startup is measured on
(``benchmarks/ui_startup.py``), and about 40% of that serves Gradio's own development only: every component class
regenerates its type stub as it is defined (``gradio.component_meta.create_or_modify_pyi`` reads and parses the
class's source file, renders a template and compares it with the ``.pyi`` beside it). The app reads no stubs.
Every component class also renders the docstring of each of its event listeners (``.click``, ``.change``, ...) as
a Jinja template, compiled anew each time (``gradio.events.EventListener.set_doc``: about 200 compilations of 36
distinct templates, about 10% of the import).

:func:`gradio` imports Gradio with the stubs skipped and each distinct listener template compiled once (the
rendered docstrings are the same) when it is the first to import Gradio, and as usual otherwise (a notebook that
imported it already; a Gradio without ``create_or_modify_pyi`` or ``Template`` is imported unchanged). It changes no
behaviour of a component.

``gradio(server=True)`` (``rstitch ui``'s page process, which only serves) also refuses, for the rest of the
process, imports that Gradio and its dependencies make only in case they are wanted, and guard with ``except
ImportError`` (:data:`UNUSED`): IPython (notebook magics, and "am I in a notebook?" checks at launch; a process that
did not import IPython before Gradio is no notebook), trio (an async backend the server, on asyncio, never runs),
pyarrow (pandas' optional Arrow storage; the page's one table, the summary, converts the same without it) and
``httpx._main`` (httpx's command-line client, with click, pygments and rich). Together about 15% of the import.

:func:`app_at_launch` skips two more: Gradio builds the server's FastAPI app (about 80 routes, each with pydantic
models) when a ``gr.Blocks`` is created, again when its ``with`` block ends, and a last time at ``launch``, which
serves the last one only. Within :func:`app_at_launch` the first two are not built (``blocks.app`` is None until
``launch``), which saves about 0.4 CPU seconds before the page is served.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType


class _Patched(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` as usual and, once one has run, applies its patch."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


def _skip_stubs(module: ModuleType) -> None:
    """``gradio.component_meta``: its stub writer does nothing."""
    if callable(getattr(module, "create_or_modify_pyi", None)):
        module.create_or_modify_pyi = _no_stub


def _templates_once(module: ModuleType) -> None:
    """``gradio.events``: ``Template(source)`` (the listeners' docstrings) compiles each distinct source once."""
    if isinstance(getattr(module, "Template", None), type):
        module.Template = functools.lru_cache(maxsize=None)(module.Template)


PATCHES = {"gradio.component_meta": _skip_stubs, "gradio.events": _templates_once}


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses the imports of :data:`UNUSED` (and their submodules), as if they were not installed."""

    def find_spec(self, name, path, target=None):
        if any(name == unused or name.startswith(unused + ".") for unused in UNUSED):
            raise ImportError(f"{name} is not imported in rstitch ui's page process (hf_rstitch.ui.gradio_import)",
                              name=name)


UNUSED = ("IPython", "trio", "pyarrow", "httpx._main")


def _no_stub(*args, **kwargs) -> None:
    """In place of ``create_or_modify_pyi``: no type stub (the app never reads one)."""


def gradio(server: bool = False) -> ModuleType:
    """The ``gradio`` module (imported here without its type stubs and with each listener template compiled once,
    when no one has imported it yet); ``server``: this process only serves, and :data:`UNUSED` stays unimported
    (where none of it is imported already)."""
    if "gradio" in sys.modules:
        return sys.modules["gradio"]
    if server and not any(name in sys.modules for name in UNUSED):
        sys.meta_path.insert(0, _Refuse())
    finder = _Patched()
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
