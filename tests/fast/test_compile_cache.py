"""The fast engine's compile-cache directory: persistent by default, never over a directory the user chose."""

import os

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from hf_rstitch.fast import compile_cache as cc


@pytest.fixture(autouse=True)
def restored_env(monkeypatch):
    """Both variables come back as they were after each test (setenv first: delenv of an absent one records
    nothing, and the code under test sets TORCHINDUCTOR_CACHE_DIR)."""
    for name in (cc.TORCH_ENV, cc.ENV):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


def test_default_is_persistent_under_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.use_persistent_cache() == str(tmp_path / "hf_rstitch" / "inductor")
    assert os.environ[cc.TORCH_ENV] == str(tmp_path / "hf_rstitch" / "inductor")
    assert (tmp_path / "hf_rstitch" / "inductor").is_dir()


def test_torchs_own_default_in_the_environment_is_not_a_choice(monkeypatch, tmp_path):
    monkeypatch.setenv(cc.TORCH_ENV, default_cache_dir())  # what importing torch._dynamo writes back
    monkeypatch.setenv(cc.ENV, str(tmp_path / "ours"))
    assert cc.use_persistent_cache() == str(tmp_path / "ours")


def test_users_torchinductor_dir_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(cc.TORCH_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(cc.ENV, str(tmp_path / "ours"))
    assert cc.use_persistent_cache() is None
    assert os.environ[cc.TORCH_ENV] == str(tmp_path / "mine")


def test_own_env_var_chooses_or_turns_off(monkeypatch, tmp_path):
    monkeypatch.setenv(cc.ENV, str(tmp_path / "ours"))
    assert cc.use_persistent_cache() == str(tmp_path / "ours")
    monkeypatch.delenv(cc.TORCH_ENV)
    monkeypatch.setenv(cc.ENV, "off")
    assert cc.use_persistent_cache() is None
    assert cc.TORCH_ENV not in os.environ


def test_unwritable_dir_falls_back_to_torch_default(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cc.ENV, str(blocker / "sub"))  # a directory under a file cannot be made
    assert cc.use_persistent_cache() is None
    assert cc.TORCH_ENV not in os.environ
