"""A model repo carrying the exported template (``export(DIR, llm=..., slm=..., threshold=...)``),
loaded with ``trust_remote_code=True`` in a process where hf-rstitch cannot be imported: plain
``generate`` is untouched unless stitching is asked, the repo's SLM and threshold drive ``generate``
and ``pipeline``, and the template refuses a transformers outside its bounds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from hf_rstitch import shipped
from hf_rstitch.hub_template import REQUIREMENTS, export
from hf_rstitch.toyworld.pair import assets_present

needs_pair = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
ROOT = Path(__file__).resolve().parents[2]
TAU, NEW = 0.001, 16
PROBLEM = "Tom has 12 apples and buys 7 more. How many apples does he have?"

BLOCK = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):  # hf-rstitch is installed here; pretend it is not
    def find_spec(self, name, path=None, target=None):
        if name == "hf_rstitch" or name.startswith("hf_rstitch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
"""

MODEL_REPO = BLOCK + r"""
import json
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

repo, ids, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = AutoModelForCausalLM.from_pretrained(repo, dtype=torch.float32, trust_remote_code=True).eval()
ids = torch.tensor([ids])
out = llm.generate(ids, max_new_tokens=n, return_dict_in_generate=True)
plain = llm.generate(ids, max_new_tokens=n, stitch=False, return_dict_in_generate=True)
tok = AutoTokenizer.from_pretrained(repo)
pipe = pipeline("text-generation", model=llm, tokenizer=tok)
text = pipe(tok.decode(ids[0]), max_new_tokens=n, return_full_text=False)[0]["generated_text"]
assert "hf_rstitch" not in sys.modules
print(json.dumps({"ids": out.sequences[0].tolist(), "roles": [str(r) for r in out.stitch.roles],
                  "plain": plain.sequences[0].tolist(), "plain_has_stitch": hasattr(plain, "stitch"),
                  "pipeline": text}))
"""


def _run(script: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=600, env=env)


def test_template_bounds_match_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for req in REQUIREMENTS:
        assert req in deps, f"{req} of the Hub template is not in pyproject.toml's dependencies {deps}"


@pytest.mark.slow  # a subprocess loading transformers and both models
@needs_pair
def test_model_repo_stitches_with_its_defaults_without_hf_rstitch(tmp_path, pair):
    llm, slm, tok = pair
    from hf_rstitch.eval.data import prompt_ids

    ids = torch.tensor([prompt_ids(tok, PROBLEM)])
    want = llm.generate(ids, assistant_model=slm, stitch_threshold=TAU, max_new_tokens=NEW, return_dict_in_generate=True)
    import hf_rstitch

    hf_rstitch.unpatch()
    try:
        plain_want = llm.generate(ids, max_new_tokens=NEW)
    finally:
        hf_rstitch.patch()
    repo = export(tmp_path / "repo", llm="shipped:llm", slm=str(shipped("slm")), threshold=TAU)
    assert json.loads((repo / "hf_rstitch_export.json").read_text())["stitch_defaults"]["stitch_threshold"] == TAU
    proc = _run(MODEL_REPO, str(repo), json.dumps(ids[0].tolist()), str(NEW))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ids"] == want.sequences[0].tolist()
    assert got["roles"] == [str(r) for r in want.stitch.roles] and "llm" in got["roles"] and "slm" in got["roles"]
    assert got["plain"] == plain_want[0].tolist() and not got["plain_has_stitch"]  # stitch=False: transformers' own
    assert got["pipeline"] == tok.decode(want.sequences[0, ids.shape[1]:])  # pipeline stitches with the defaults


PLAIN = BLOCK + r"""
import json
import torch
from transformers import AutoModelForCausalLM

repo, pair = sys.argv[1], sys.argv[2]
llm = AutoModelForCausalLM.from_pretrained(pair + "/llm", dtype=torch.float32).eval()
ids = torch.tensor([[2, 40, 41, 42]])
want = llm.generate(ids, max_new_tokens=6)
got = llm.generate(ids, max_new_tokens=6, custom_generate=repo, trust_remote_code=True)
assert torch.equal(got, want)
try:
    llm.generate(ids, max_new_tokens=6, custom_generate=repo + "-old", trust_remote_code=True)
    error = ""
except ImportError as err:
    error = str(err)
print(json.dumps({"error": error}))
"""


@pytest.mark.slow
@needs_pair
def test_plain_generate_is_untouched_and_bounds_are_checked(tmp_path):
    repo = export(tmp_path / "repo")  # no defaults: stitching only when asked
    old = export(tmp_path / "repo-old")
    source = (old / "custom_generate" / "generate.py").read_text()
    source, n = re.subn(r"TEMPLATE_REQUIREMENTS = \(.*\)", 'TEMPLATE_REQUIREMENTS = ("transformers>=5.17,<5.18",)', source)
    assert n == 1
    (old / "custom_generate" / "generate.py").write_text(source)
    proc = _run(PLAIN, str(repo), str(shipped("pair")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert "transformers>=5.17,<5.18" in error and "re-export the template" in error
