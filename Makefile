# The two set-up commands of the README. Each works by itself on a fresh clone, with any interpreter
# (make demo PYTHON=.venv/bin/python): everything runs through $(PYTHON) -m, never a bare `rstitch`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch==2.13.0 first: on the project's CPU machines it is a local CPU wheel, and it keeps pip from
# resolving an unpinned torch to a multi-GB CUDA build. On your machine it is the ordinary release.
TORCH ?= torch==2.13.0

.PHONY: install install-dev demo test

install:
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .

install-dev:
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev]"

demo: install
	HF_HUB_OFFLINE=1 $(PYTHON) -m hf_rstitch demo

test: install-dev
	HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q
