# The two set-up commands of the README. Each works by itself on a fresh clone, with any interpreter
# (make demo PYTHON=.venv/bin/python): everything runs through $(PYTHON) -m, never a bare `rstitch`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch==2.13.0 first: on the project's CPU machines it is a local CPU wheel, and it keeps pip from
# resolving an unpinned torch to a multi-GB CUDA build. On your machine it is the ordinary release.
TORCH ?= torch==2.13.0

.PHONY: install install-dev demo test test-slow

install:
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .

install-dev:
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev]"

demo: install
	HF_HUB_OFFLINE=1 $(PYTHON) -m hf_rstitch demo

# The fast tier (about a minute on 2 cores): every test not marked slow. pytest exits 5 when it
# collects no test, which is not a failure here.
test: install-dev
	HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q -m "not slow" || [ $$? -eq 5 ]

# The slow tier: tests marked slow by measured duration (> ~3 s each). CI (.ci/run) runs both tiers.
test-slow: install-dev
	HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q -m slow || [ $$? -eq 5 ]
