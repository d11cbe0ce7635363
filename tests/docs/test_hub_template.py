"""The exported Hub ``custom_generate`` template: loaded from a local folder by transformers, with
and without hf-rstitch importable, it must decode exactly as the patched ``generate`` does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import hf_rstitch
from hf_rstitch.cli.main import main
from hf_rstitch.hub_template import MODULES, ExportError, export, flatten_module, render
from hf_rstitch.toyworld.pair import ASSETS, assets_present

needs_pair = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")

PROBLEM = "Tom has 12 apples and buys 7 more. How many apples does he have?"


def _ids(tok):
    from hf_rstitch.eval.data import prompt_ids

    ids = torch.tensor([prompt_ids(tok, PROBLEM)])
    return ids, torch.ones_like(ids)


def test_export_writes_a_custom_generate_repo(tmp_path):
    out = export(tmp_path / "repo", repo_id="me/rstitch")
    source = (out / "custom_generate" / "generate.py").read_text()
    assert "def generate(*args, model, **kwargs)" in source
    assert "from ." not in source and "\nfrom hf_rstitch" not in source  # flattened, package-free at import time
    for rel in MODULES:
        assert f"# ==== hf_rstitch/{rel}" in source
    readme = (out / "README.md").read_text()
    assert "custom_generate" in readme.split("---")[1] and 'custom_generate="me/rstitch"' in readme
    assert "transformers" in (out / "custom_generate" / "requirements.txt").read_text()


def test_transformers_import_check_needs_only_torch_and_transformers(tmp_path):
    from transformers.dynamic_module_utils import get_imports

    out = export(tmp_path / "repo")
    needed = set(get_imports(out / "custom_generate" / "generate.py"))
    assert needed - set(sys.stdlib_module_names) == {"torch", "transformers"}


def test_flatten_refuses_what_it_cannot_flatten():
    with pytest.raises(ExportError, match="as"):
        flatten_module("from .x import y as z\n", "m.py")
    with pytest.raises(ExportError, match="no template fallback"):
        flatten_module("def f():\n    from ..eval import evaluate\n", "m.py")


def test_cli_refuses_a_non_empty_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert main(["export-hub-template", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export-hub-template", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / "custom_generate" / "generate.py").is_file()


def test_card_templates_render_and_name_missing_values():
    card = render("router_card.md", slm_id="a/slm", llm_id="a/llm", hidden_size=192, threshold=0.001,
                  parameters="32,226", repo_id="a/router", training="DAPO", results="-")
    assert card.startswith("---") and "stitch_router=\"a/router\"" in card
    with pytest.raises(ValueError, match="device"):
        render("profile_card.md", model_id="a/m")


NEW_TOKENS = 16  # enough for several hand-overs both ways at tau = 0.001


@pytest.fixture(scope="module")
def reference(pair):
    """Prompt ids, generate arguments and the patched generate's output on the shipped pair."""
    llm, slm, tok = pair
    ids, mask = _ids(tok)
    args = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, stitch_threshold=0.001, return_dict_in_generate=True)
    return ids, args, llm.generate(ids, assistant_model=slm, **args)


@pytest.mark.slow  # with the template tests below: 5 s fixture + 8 s subprocess
@needs_pair
def test_local_template_equals_patched_generate(tmp_path, pair, reference):
    llm, slm, _ = pair
    ids, args, want = reference
    out = export(tmp_path / "repo")
    hf_rstitch.unpatch()
    try:
        got = llm.generate(ids, custom_generate=str(out), trust_remote_code=True, assistant_model=slm, **args)
    finally:
        hf_rstitch.patch()
    assert torch.equal(got.sequences, want.sequences)
    assert [str(r) for r in got.stitch.roles] == [str(r) for r in want.stitch.roles]
    assert got.stitch.llm_tokens > 0 and got.stitch.slm_tokens > 0  # both models took part
    assert got.stitch.summary() == want.stitch.summary()


BLOCKED = r"""
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):  # hf-rstitch is installed here; pretend it is not
    def find_spec(self, name, path=None, target=None):
        if name == "hf_rstitch" or name.startswith("hf_rstitch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
import torch
from transformers import AutoModelForCausalLM
repo, pair, ids, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = AutoModelForCausalLM.from_pretrained(pair + "/llm", dtype=torch.float32).eval()
slm = AutoModelForCausalLM.from_pretrained(pair + "/slm", dtype=torch.float32).eval()
ids = torch.tensor([ids])
out = llm.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=repo, trust_remote_code=True,
                   assistant_model=slm, stitch_threshold=0.001, max_new_tokens=n, return_dict_in_generate=True)
try:
    llm.generate(ids, custom_generate=repo, trust_remote_code=True, assistant_model=slm, stitch_router="x")
    router_error = ""
except ImportError as err:
    router_error = str(err)
assert "hf_rstitch" not in sys.modules
print(json.dumps({"ids": out.sequences[0].tolist(), "roles": [str(r) for r in out.stitch.roles],
                  "router_error": router_error}))
"""


@pytest.mark.slow
@needs_pair
def test_template_runs_without_hf_rstitch(tmp_path, reference):
    ids, _, want = reference
    out = export(tmp_path / "repo")
    argv = [str(out), str(ASSETS), json.dumps(ids[0].tolist()), str(NEW_TOKENS)]
    proc = subprocess.run([sys.executable, "-c", BLOCKED, *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ids"] == want.sequences[0].tolist()
    assert got["roles"] == [str(r) for r in want.stitch.roles]
    assert "install hf-rstitch" in got["router_error"] and "wheel" in got["router_error"]


@pytest.mark.slow
@needs_pair
def test_template_also_runs_while_the_package_patch_is_active(tmp_path, pair, reference):
    llm, slm, _ = pair
    ids, args, want = reference
    out = export(tmp_path / "repo")
    assert hf_rstitch.is_patched()
    got = llm.generate(ids, custom_generate=str(out), trust_remote_code=True, assistant_model=slm, **args)
    assert torch.equal(got.sequences, want.sequences)
