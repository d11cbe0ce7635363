"""What the docstrings promise about import cost: no torch / transformers where none is needed."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")


def loaded_after(code: str) -> list[str]:
    """Heavy modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("module", ["hf_rstitch", "hf_rstitch.eval.config", "hf_rstitch.router.config",
                                    "hf_rstitch.latency", "hf_rstitch.toyworld", "hf_rstitch.eval.grading",
                                    "hf_rstitch.ui"])
def test_torch_free_modules_import_without_torch(module):
    assert loaded_after(f"import {module}") == []


def test_rstitch_help_imports_neither_torch_nor_transformers():
    code = ("import contextlib, io\nfrom hf_rstitch.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "    for cmd in ('eval', 'train-router', 'toyworld', 'demo', 'generate', 'profile', 'ui'):\n"
            "        try:\n            main([cmd, '--help'])\n        except SystemExit:\n            pass")
    assert loaded_after(code) == []


@pytest.mark.slow  # 40 s on 2 busy cores: a fresh interpreter imports transformers (pytest --durations, issue 47)
def test_the_generate_patch_lands_when_transformers_loads():
    code = ("import hf_rstitch\nfrom transformers import LlamaForCausalLM\n"
            "from hf_rstitch.hf.patch import is_patched\nassert is_patched()\n"
            "from hf_rstitch.hf.patch import _state_of\nassert _state_of(LlamaForCausalLM.generate)['active']")
    assert loaded_after(code) == list(HEAVY)
