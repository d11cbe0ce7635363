"""Fixtures for the docs / examples / Hub-template tests: the shipped pair, loaded once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pair():
    from hf_rstitch.toyworld.pair import load_pair

    return load_pair("cpu")
