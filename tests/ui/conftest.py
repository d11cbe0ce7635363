"""A served app for the Gradio and browser tests: ``app()`` on the shipped pair, launched on 127.0.0.1 at a free
port in this process (Gradio's server thread), closed after the module."""

import html
import re

import pytest

from hf_rstitch.toyworld.pair import assets_present


@pytest.fixture(scope="module")
def served():
    """``(url, blocks)`` of the app on the shipped pair."""
    pytest.importorskip("gradio", reason="the app needs Gradio (the ui extra; the dev extra installs it)")
    if not assets_present():
        pytest.skip("the shipped pair is not in this checkout")
    import torch

    from hf_rstitch.cli.ui import free_port
    from hf_rstitch.ui import app

    torch.set_num_threads(1)
    blocks = app()
    _, url, _ = blocks.launch(server_name="127.0.0.1", server_port=free_port("127.0.0.1"), prevent_thread_lock=True,
                              quiet=True)
    yield url, blocks
    blocks.close()


def _text_of(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


@pytest.fixture
def text_of():
    """The text of HTML as a browser shows it (tags dropped, entities decoded)."""
    return _text_of
