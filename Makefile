# The two set-up commands of the README. Each works by itself on a fresh clone, with any interpreter
# (make demo PYTHON=.venv/bin/python): everything runs through $(PYTHON) -m, never a bare `rstitch`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch==2.13.0 first: on the project's CPU machines it is a local CPU wheel, and it keeps pip from
# resolving an unpinned torch to a multi-GB CUDA build. On your machine it is PyPI's release (the CUDA build on
# Linux); for the CPU build: make demo TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

SHELL := /bin/bash
KERNEL_TESTS = tests/fast/kernels/test_gemv.py tests/fast/kernels/test_gated.py tests/fast/patches/test_folds.py \
	tests/fast/kernels/test_decode_attention.py tests/fast/kernels/test_fused_entropy.py \
	tests/fast/kernels/test_rope_store.py tests/fast/kernels/test_expert_gemv.py tests/fast/patches/test_fast_moe.py \
	tests/fast/kernels/test_norms.py tests/fast/kernels/test_moe_router.py tests/fast/test_virtual_rows.py
# The GPU tier: the tests that exercise CUDA (marked gpu, or cuda by tests/conftest.py), over pytest-xdist's
# workers where it is installed (the dev extra), to fit one 10-minute device call.
GPU_TESTS = tests/fast tests/multigpu/test_gpu.py
GPU_SELECT = gpu or cuda
GPU_WORKERS ?= 8
# seconds; then pytest is interrupted (SIGINT) and still prints its summary, failures named, within one device call
GPU_TIMEOUT ?= 540
GPU_RESULT ?= benchmarks/results/gpu_tests.txt

.PHONY: install install-dev demo test test-slow test-kernels test-gpu check-assets

install:
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e .

install-dev:
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[dev]"

demo: install
	HF_HUB_OFFLINE=1 $(PYTHON) -m hf_rstitch demo

# The fast tier: every test not marked slow (README, "Tests", says what it takes). pytest exits 5 when it
# collects no test, which is not a failure here.
test: install-dev
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q -m "not slow" || [ $$? -eq 5 ]

# The slow tier: tests marked slow by measured duration (> ~3 s each). CI (.ci/run) runs both tiers.
test-slow: install-dev
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q -m slow || [ $$? -eq 5 ]

# The Triton kernels on CPU, under Triton's interpreter (triton is in the dev extra): without it these files
# skip all but 3 of their tests. Only these files: the interpreter's bf16 rounding is not a GPU's, so the
# end-to-end bf16 accuracy bounds of test_fast_gpu.py hold on CUDA, not here (docs/fast-engine.md, "Tests").
test-kernels: install-dev
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q $(KERNEL_TESTS)

# Whether each shipped GPU asset (GEMV tuning table, Triton kernels) was made from this checkout's kernel code
# (exit 1 where one is stale: make it again on its GPU; docs/fast-engine.md, "Compiled kernels ship too").
check-assets:
	OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR) $(PYTHON) tools/check_assets.py

# The GPU tier, on a CUDA machine, in one go (no install: the machine may have no network); the result,
# with the card, versions, date and commit, goes to $(GPU_RESULT) (the latest is kept in the repository).
test-gpu:
	set -o pipefail; workers=$$($(PYTHON) -c 'import xdist' 2>/dev/null && echo "-n $(GPU_WORKERS)"); { \
	  $(PYTHON) -c 'import datetime, torch, transformers; card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"; print(f"# GPU tests on {card} (torch {torch.__version__}, transformers {transformers.__version__}), {datetime.date.today()}")'; \
	  echo "# commit $$(git rev-parse --short HEAD 2>/dev/null || echo unknown): make test-gpu = $(PYTHON) -m pytest -q -rfEs --durations=10 $$workers -m '$(GPU_SELECT)' $(GPU_TESTS)"; \
	  HF_HUB_OFFLINE=1 timeout -s INT $(GPU_TIMEOUT) $(PYTHON) -m pytest -q -rfEs --durations=10 -p no:benchmark $$workers \
	    -m "$(GPU_SELECT)" $(GPU_TESTS) 2>&1; } | tee $(GPU_RESULT)
