"""The fast engine's compile-cache directory: persistent by default, never over a directory already chosen."""

import os

from hf_rstitch.fast import compile_cache as cc


def test_default_is_persistent_under_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.TORCH_ENV, raising=False)
    monkeypatch.delenv(cc.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.use_persistent_cache() == str(tmp_path / "hf_rstitch" / "inductor")
    assert os.environ[cc.TORCH_ENV] == str(tmp_path / "hf_rstitch" / "inductor")
    assert (tmp_path / "hf_rstitch" / "inductor").is_dir()


def test_users_torchinductor_dir_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(cc.TORCH_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(cc.ENV, str(tmp_path / "ours"))
    assert cc.use_persistent_cache() is None
    assert os.environ[cc.TORCH_ENV] == str(tmp_path / "mine")


def test_own_env_var_chooses_or_turns_off(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.TORCH_ENV, raising=False)
    monkeypatch.setenv(cc.ENV, str(tmp_path / "ours"))
    assert cc.use_persistent_cache() == str(tmp_path / "ours")
    monkeypatch.delenv(cc.TORCH_ENV)
    monkeypatch.setenv(cc.ENV, "off")
    assert cc.use_persistent_cache() is None
    assert cc.TORCH_ENV not in os.environ


def test_unwritable_dir_falls_back_to_torch_default(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.delenv(cc.TORCH_ENV, raising=False)
    monkeypatch.setenv(cc.ENV, str(blocker / "sub"))  # a directory under a file cannot be made
    assert cc.use_persistent_cache() is None
    assert cc.TORCH_ENV not in os.environ
