"""Stitching settings on the LLM's generation config survive save_pretrained / from_pretrained /
push_to_hub whatever ``_from_model_config`` says, and plain ``generate`` uses them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import hf_rstitch
from hf_rstitch.hf import persist
from hf_rstitch.hf.settings import SLM_KEY, configure, stitch_settings
from tiny_models import make_pair, prompt

N_NEW = 12


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def _fresh(llm):
    """A copy of the LLM whose generation config was derived from its model config (the common case)."""
    model = type(llm)(llm.config).double().eval()
    model.load_state_dict(llm.state_dict())
    assert model.generation_config._from_model_config
    return model


def _saved(tmp_path, model, name="llm"):
    model.save_pretrained(tmp_path / name)
    return tmp_path / name, json.loads((tmp_path / name / "generation_config.json").read_text())


def test_plain_assignment_survives_save_and_load(tmp_path, pair):
    model = _fresh(pair[0])
    model.generation_config.stitch_threshold = 0.005
    path, written = _saved(tmp_path, model)
    assert written["stitch_threshold"] == 0.005 and written["_from_model_config"] is False
    assert AutoModelForCausalLM.from_pretrained(path).generation_config.stitch_threshold == 0.005


def test_written_file_needs_no_hf_rstitch_to_load(tmp_path, pair):
    model = _fresh(pair[0])
    configure(model, threshold=0.01, slm="org/slm", router="shipped")
    path, _ = _saved(tmp_path, model)
    persist.unhook()  # transformers alone, as in a venv without hf-rstitch
    try:
        loaded = GenerationConfig.from_pretrained(path)
    finally:
        persist.hook()
    assert stitch_settings(loaded) == {"stitch_threshold": 0.01, SLM_KEY: "org/slm",
                                       "stitch_router_name_or_path": "shipped"}


def test_file_marked_from_model_config_is_repaired_on_load(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "eos_token_id": 1, "stitch_threshold": 0.02}))
    persist.unhook()
    try:
        assert getattr(GenerationConfig.from_pretrained(tmp_path), "stitch_threshold", None) is None  # the bug
    finally:
        persist.hook()
    assert GenerationConfig.from_pretrained(tmp_path).stitch_threshold == 0.02


def test_hook_is_idempotent_and_reversible():
    hf_rstitch.hf.persist.hook()
    hf_rstitch.hf.persist.hook()
    inner = GenerationConfig.save_pretrained.__rstitch_original__
    assert not hasattr(inner, "__rstitch_original__")  # not stacked
    persist.unhook()
    assert not persist.is_hooked() and GenerationConfig.save_pretrained is inner
    persist.hook()
    assert persist.is_hooked()


def test_push_to_hub_uploads_the_settings(tmp_path, pair, monkeypatch):
    """push_to_hub saves into a temporary folder, then uploads it: capture that folder offline."""
    from transformers.utils import hub

    model = _fresh(pair[0])
    model.generation_config.stitch_threshold = 0.003
    uploaded = {}

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            return type("Repo", (), {"repo_id": repo_id})()

    class Card:
        def save(self, path):
            pass

    def upload(self, working_dir, repo_id, files_timestamps, **kw):
        uploaded.update(json.loads((Path(working_dir) / "generation_config.json").read_text()))

    monkeypatch.setattr(hub, "hf_api", lambda: FakeApi())
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **k: Card())
    monkeypatch.setattr(type(model), "_upload_modified_files", upload)
    model.push_to_hub("me/stitched-llm")
    assert uploaded["stitch_threshold"] == 0.003 and uploaded["_from_model_config"] is False


def test_saved_threshold_and_slm_reference_drive_plain_generate(tmp_path, pair):
    llm, slm = pair
    slm_path, _ = _saved(tmp_path, slm, "slm")
    model = _fresh(llm)
    configure(model, threshold=0.6, slm=str(slm_path))
    path, _ = _saved(tmp_path, model)
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    ids = prompt()
    got = loaded.generate(ids, max_new_tokens=N_NEW, return_dict_in_generate=True)
    want = llm.generate(ids, assistant_model=slm, stitch_threshold=0.6, max_new_tokens=N_NEW,
                        return_dict_in_generate=True)
    assert torch.equal(got.sequences, want.sequences)
    assert got.stitch.llm_tokens > 0 and got.stitch.slm_tokens > 0  # stitched, not speculative decoding


def test_configure_validates_and_refuses_colliding_entries(pair):
    model = _fresh(pair[0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        configure(model, threshold=2)
    with pytest.raises(TypeError, match="save a Router"):
        configure(model, router=object())
    model.generation_config.stitch_threshold = 0.5
    model.generation_config.stitch_slm = "org/slm"
    with pytest.raises(ValueError, match="stitch_slm_name_or_path"):
        model.generate(prompt(), max_new_tokens=2)


def test_configure_takes_the_shipped_slm_as_a_path_and_stores_no_install_path(tmp_path):
    """hf_rstitch.shipped() returns a Path; configure stores it as "shipped:slm", never a path into this venv."""
    from hf_rstitch.toyworld.pair import load_pair

    llm, _, tok = load_pair()
    configure(llm, threshold=0.005, slm=hf_rstitch.shipped("slm"))
    assert llm.generation_config.stitch_slm_name_or_path == "shipped:slm"
    llm.save_pretrained(tmp_path / "llm")
    written = (tmp_path / "llm" / "generation_config.json").read_text()
    assert "shipped:slm" in written and str(hf_rstitch.shipped("pair")) not in written
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "llm").eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "Zoe has 61 stickers. Then Zoe finds 23 more. How many stickers does Zoe have now?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = loaded.generate(**ids, max_new_tokens=30, return_dict_in_generate=True)
    assert out.stitch.slm_tokens > 0  # the stored reference loaded the shipped SLM


def test_configure_says_what_it_takes_for_an_unnamed_model(pair):
    with pytest.raises(ValueError, match=r"str or Path"):
        configure(_fresh(pair[0]), slm=object())


def test_hooks_keep_transformers_signatures_and_docstrings():
    import inspect

    for name in ("save_pretrained", "from_dict"):
        hooked = getattr(GenerationConfig, name)
        original = hooked.__rstitch_original__ if name == "save_pretrained" else \
            GenerationConfig.__dict__[name].__func__.__rstitch_original__
        assert hooked.__name__ == name and hooked.__doc__ == original.__doc__
        want = inspect.signature(original)
        if name == "from_dict":  # a classmethod: bound, without cls
            want = want.replace(parameters=list(want.parameters.values())[1:])
        assert inspect.signature(hooked) == want


def test_lazy_modules_list_their_names():
    import hf_rstitch.eval
    import hf_rstitch.router

    assert {"Router", "RouterPolicy", "load_router"} <= set(dir(hf_rstitch.router))
    assert {"evaluate", "sweep", "EvalConfig"} <= set(dir(hf_rstitch.eval))
    assert "configure" in dir(hf_rstitch)


def test_validate_checks_the_stitching_entries_where_transformers_checks_its_own():
    config = GenerationConfig(max_new_tokens=4)
    config.stitch_threshold = 5.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        config.validate(strict=True)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        GenerationConfig(stitch_threshold=-0.1)
    config.stitch_threshold = 0.02
    config.validate(strict=True)
    config.stitch_slm_name_or_path = object()
    with pytest.raises(ValueError, match="a string"):
        config.validate()
