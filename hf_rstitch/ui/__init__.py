"""See it stitch: a Gradio page that runs a pair and shows which model wrote each token, as it streams.

    rstitch ui                                   # the shipped pair, offline, on CPU
    rstitch ui --llm org/llm --slm org/slm       # any pair that shares a tokenizer

    from hf_rstitch.ui import app
    app().launch()                               # in Colab / Jupyter the page renders inline

Modules: :mod:`.pair` loads the pair, :mod:`.run` streams one run (stitched, or the LLM alone), :mod:`.frames`
sends it to the page (each token's text, writer and entropies) and turns it into the page's outputs, :mod:`.render`
turns a snapshot into HTML / SVG, :mod:`.code` writes the reproducing ``generate`` call, :mod:`.pairs` loads a
page's pairs in this process and :mod:`.worker` in a worker process (``rstitch ui``), :mod:`.page` is the page
(served before the pair loads), :mod:`.gradio_import` imports Gradio without what the app never uses, :mod:`.space`
writes a Hugging Face Space that serves it. Needs Gradio (hf-rstitch's ``ui`` extra); importing this
package does not import it, nor torch.
"""

from __future__ import annotations

from typing import Any


def app(llm: str | None = None, slm: str | None = None, router: str | None = None) -> Any:
    """The page as a ``gr.Blocks`` for a pair (default: the shipped one); see :func:`hf_rstitch.ui.page.app`."""
    _need_gradio()
    from .page import app as build

    return build(llm, slm, router)


def serve(llm: str | None = None, slm: str | None = None, router: str | None = None, **launch) -> None:
    """Serve the page, then load the pair (``rstitch ui``); see :func:`hf_rstitch.ui.page.serve`."""
    _need_gradio()
    from .page import serve as run

    run(llm, slm, router, **launch)


def _need_gradio() -> None:
    import importlib.util

    from ..extras import install_hint

    if importlib.util.find_spec("gradio") is None:
        raise ImportError(f"the app needs Gradio: {install_hint('ui')}")


__all__ = ["app", "serve"]
