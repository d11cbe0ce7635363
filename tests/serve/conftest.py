"""Fixtures for the server tests: the shipped pair's tokenizer (chat template, word-level
vocabulary) and a TestClient over an app on the scripted fake engine."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from hf_rstitch.toyworld.pair import ASSETS

    return AutoTokenizer.from_pretrained(ASSETS / "llm")


@pytest.fixture
def client(tokenizer):
    from fastapi.testclient import TestClient

    from serve.helpers import make_app

    app, engine = make_app(tokenizer)
    with TestClient(app) as c:
        c.engine = engine
        yield c


@pytest.fixture
def one_thread():
    """One torch thread: on a small shared CPU, several threads per process thrash (40x slower here)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
