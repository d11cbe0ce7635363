"""The tuner's choices on disk (hf_rstitch.fast.kernels.tuning_cache): a later process finds them, for the same
machine and code only; bad files and unwritable places cost a warning, never a failure."""

import json

import pytest
import torch

from hf_rstitch.fast.kernels import gemv, tuning_cache
from hf_rstitch.fast.patches import linears
from hf_rstitch.fast.kernels.gemv import GemvConfig
from hf_rstitch.fast.kernels.tuning_cache import TuningTable

pytest.importorskip("triton")

KEY = ((64, 32), torch.bfloat16, False, "cpu", 1)
GATED = ("gated", (96, 32), torch.float16, False, "cpu", 16)


@pytest.fixture
def warned(monkeypatch) -> list:
    """The module's warnings (read from its logger directly: other tests may stop "hf_rstitch" propagating)."""
    seen = []
    monkeypatch.setattr(tuning_cache.log, "warning", lambda fmt, *args: seen.append(fmt % args))
    return seen


def _table(path) -> TuningTable:
    table = TuningTable(path)
    table.kept = ("cpu",)  # CUDA only in use (nothing is timed elsewhere); the tests keep CPU keys too
    return table


def test_a_later_table_finds_what_an_earlier_one_chose(tmp_path):
    path = tmp_path / "t.json"
    first = _table(path)
    first[KEY] = GemvConfig(8, 512, 4, 3, 1)
    first[GATED] = None  # cuBLAS won: kept as a choice too
    second = _table(path)
    assert KEY in second and GATED in second
    assert second[KEY] == GemvConfig(8, 512, 4, 3, 1) and second[GATED] is None
    assert ((1, 1), torch.bfloat16, False, "cpu", 1) not in second
    assert json.loads(path.read_text())["format"] == tuning_cache.FORMAT


def test_choices_hold_only_for_the_machine_and_code_that_made_them(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    _table(path)[KEY] = GemvConfig()
    monkeypatch.setattr(tuning_cache, "identity", lambda device: "another GPU")
    other = _table(path)
    assert KEY not in other
    other[KEY] = GemvConfig(16, 256, 4, 2, 1)  # both kept, each for its own machine
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_keys_off_cuda_stay_in_memory_by_default(tmp_path):
    path = tmp_path / "t.json"
    table = TuningTable(path)
    table[KEY] = GemvConfig()
    assert KEY in table and not path.exists()


def test_off_keeps_everything_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.ENV, "off")
    assert tuning_cache.default_path() is None
    monkeypatch.setenv(tuning_cache.ENV, str(tmp_path / "mine.json"))
    assert tuning_cache.default_path() == tmp_path / "mine.json"
    monkeypatch.delenv(tuning_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning_cache.default_path() == tmp_path / "hf_rstitch" / "gemv_tuning.json"
    table = _table(None)
    table[KEY] = GemvConfig()
    assert KEY in table and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99, "entries": {}}), json.dumps([1, 2])])
def test_a_bad_file_is_replaced_with_a_warning(tmp_path, content, warned):
    path = tmp_path / "t.json"
    path.write_text(content)
    table = _table(path)
    assert KEY not in table
    assert len(warned) == 1 and "tuning again" in warned[0]
    table[KEY] = GemvConfig()
    assert KEY in _table(path)


def test_an_unwritable_place_costs_a_warning_not_a_failure(tmp_path, warned):
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    table = _table(blocked / "t.json")  # its parent is a file: nothing can be written there
    table[KEY] = GemvConfig()
    table[GATED] = None
    assert table[KEY] == GemvConfig() and table[GATED] is None
    assert len(warned) == 1 and "cannot write" in warned[0]  # once a table, not once a shape


def test_the_tuner_times_a_shape_once_across_processes(tmp_path, monkeypatch):
    timed = []
    monkeypatch.setattr(gemv, "tune", lambda w, b, candidates: timed.append(w.shape) or GemvConfig(4, 256, 2, 2, 1))
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    path = tmp_path / "t.json"
    for _ in range(2):  # two "processes": each its own table over the same file
        assert linears.config_for(_table(path), weight, None, 1) == GemvConfig(4, 256, 2, 2, 1)
    assert timed == [torch.Size([64, 32])]


def test_a_shipped_table_answers_what_this_machine_has_not_tuned(tmp_path, monkeypatch):
    """A shipped table (same format, same identity) answers keys this machine's file lacks, without being copied
    into it; this machine's own choice wins; a shipped entry of another machine or code does not count; and
    HF_RSTITCH_SHIPPED_TUNING=off ignores the shipped tables."""
    shipped = tmp_path / "gpu.json"
    maker = _table(shipped)
    maker.shipped = []
    maker[KEY] = GemvConfig(2, 1024, 4, 2, 1)
    maker[GATED] = GemvConfig(32, 64, 4, 2, 16)
    mine = tmp_path / "mine.json"
    table = TuningTable(mine, shipped=[shipped])
    table.kept = ("cpu",)
    table[GATED] = None  # tuned here: wins over the shipped choice
    assert table[KEY] == GemvConfig(2, 1024, 4, 2, 1) and table.from_shipped == 1
    assert _table_with(mine, shipped)[GATED] is None
    assert len(json.loads(mine.read_text())["entries"]) == 1  # the shipped choice was not copied
    monkeypatch.setattr(tuning_cache, "identity", lambda device: "another GPU")
    assert KEY not in _table_with(mine, shipped)
    monkeypatch.undo()
    monkeypatch.setattr(tuning_cache, "SHIPPED_DIR", tmp_path)
    assert tuning_cache.shipped_paths() == [shipped, mine]
    monkeypatch.setenv(tuning_cache.SHIPPED_ENV, "off")
    assert tuning_cache.shipped_paths() == []


def _table_with(path, shipped) -> TuningTable:
    table = TuningTable(path, shipped=[shipped])
    table.kept = ("cpu",)
    return table


def test_cold_copies_cycle_through_twice_the_l2_of_weights(monkeypatch):
    """The tuner times each candidate on weights read from device memory: on CUDA, copies of a product's weights
    totalling at least twice L2 (at most one set a timed call); off CUDA, and with HF_RSTITCH_TUNE_L2=warm, the
    weights alone."""
    from hf_rstitch.fast.kernels import triton_support

    w = torch.randn(64, 32)
    assert triton_support.cold_copies((w, None), 20) == [(w, None)]
    nxt = triton_support.cycling([(1,), (2,), (3,)])
    assert [nxt()[0] for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    monkeypatch.setenv(triton_support.L2_ENV, "lukewarm")
    with pytest.raises(ValueError, match="HF_RSTITCH_TUNE_L2 must be 'cold'"):
        triton_support.cold_copies((w,), 20)
    if not torch.cuda.is_available():
        return
    monkeypatch.setenv(triton_support.L2_ENV, "cold")
    wc = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")  # 2 MB
    sets = triton_support.cold_copies((wc, None), 64)
    l2 = torch.cuda.get_device_properties(wc.device).L2_cache_size
    assert len(sets) * 2 * 2**20 >= 2 * l2 and sets[0][0] is wc and all(torch.equal(s[0], wc) for s in sets)
    assert len(triton_support.cold_copies((wc, None), 8)) == 8
    monkeypatch.setenv(triton_support.L2_ENV, "warm")
    assert triton_support.cold_copies((wc, None), 64) == [(wc, None)]


def test_rekey_moves_a_table_to_this_code_and_notes_the_old(tmp_path):
    """tools/gemv_tuning_table.py --rekey: every key gets this tree's code hash (so the table is read again), the
    values are untouched, and the hash the choices were timed on is kept in the file."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gemv_tuning_table", root / "tools" / "gemv_tuning_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    key = '[[8, 4], "torch.bfloat16", false, "GPU|sm90|132sm|1MiB|torch 2|triton 3|code 0123abcd", 1]'
    value = {"type": "GemvConfig", "block_n": 2, "block_k": 512, "num_warps": 4, "num_stages": 2, "block_m": 1,
             "split_k": 1}
    table = tmp_path / "gpu.json"
    table.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": {key: value}}))
    out = tool.rekey(table)
    data = json.loads(table.read_text())
    code = tuning_cache._code_hash()
    assert out["code"] == code and data["timed_on_code"] == ["0123abcd"]
    assert data["entries"] == {key.replace("0123abcd", code): value}


def test_a_shipped_table_is_current_only_for_this_kernel_code(tmp_path):
    """tuning_cache.freshness, as tools/check_assets.py reads it: every key names this code -> current; any other
    code -> stale (a fresh machine would time those shapes again); no code at all -> unknown."""
    value = {"type": "GemvConfig", "block_n": 2, "block_k": 512, "num_warps": 4, "num_stages": 2, "block_m": 1,
             "split_k": 1}

    def table(*codes):
        keys = [f'[[8, {i}], "torch.bfloat16", false, "GPU|sm90|triton 3|code {c}", 1]' for i, c in enumerate(codes)]
        path = tmp_path / f"t{len(codes)}{'_'.join(codes)}.json"
        path.write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": {k: value for k in keys}}))
        return path

    code = tuning_cache._code_hash()
    assert tuning_cache.freshness(table(code, code)) == "current"
    assert tuning_cache.freshness(table(code, "0123abcd")) == "stale"
    assert tuning_cache.freshness(table()) == "unknown"
    (tmp_path / "bad.json").write_text("[1, 2")
    assert tuning_cache.freshness(tmp_path / "bad.json") == "unknown"


def test_check_assets_names_each_shipped_asset_and_what_remakes_it(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from hf_rstitch.fast.kernels import triton_cache

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("check_assets", root / "tools" / "check_assets.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tuning, kernels = tmp_path / "tuning", tmp_path / "kernels"
    tuning.mkdir()
    kernels.mkdir()
    key = f'[[8, 4], "torch.bfloat16", false, "GPU|code {tuning_cache._code_hash()}", 1]'
    (tuning / "gpu.json").write_text(json.dumps({"format": tuning_cache.FORMAT, "entries": {key: None}}))
    (kernels / "gpu.json").write_text(json.dumps({"format": triton_cache.FORMAT, "identity": "GPU",
                                                  "kernel_sources": "0" * 64}))
    assert tool.states(tuning, kernels) == [("gemv_tuning/gpu.json", "current", "tools/gemv_tuning_table.py"),
                                            ("triton_kernels/gpu.json", "stale", "tools/triton_kernels_asset.py")]
    shipped = tool.states()  # the package's own: every asset named, whatever its state
    assert {a.split("/")[0] for a, _, _ in shipped} == {"gemv_tuning", "triton_kernels"}
    assert tool.main([]) == int(any(state != "current" for _, state, _ in shipped))
    assert "triton_kernels/nvidia_h200.json" in capsys.readouterr().out
