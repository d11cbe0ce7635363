"""The shipped Triton kernels (hf_rstitch.fast.kernels.triton_cache): an archive packed from a cache seeds another
one, for the machine it was made on only, whole entries, never overwriting, and not at all when switched off."""

import json
from pathlib import Path

import pytest
import torch

from hf_rstitch.fast.kernels import triton_cache

pytest.importorskip("triton")

MACHINE = "NVIDIA H100 80GB HBM3|sm90|132sm|81089MiB|torch 2.11.0+cu130|triton 3.6.0"


def _fake_cache(root):
    """A Triton cache as a compile leaves it: a kernel entry (group index with absolute paths, metadata, binary,
    intermediate IRs) and a launcher entry (a shared object)."""
    kernel = root / "AAAA"
    kernel.mkdir(parents=True)
    files = {"gemv.json": '{"name": "gemv"}', "gemv.cubin": "\x7fELF", "gemv.ptx": "// ptx", "gemv.ttir": "ir"}
    for name, text in files.items():
        (kernel / name).write_text(text)
    (kernel / "__grp__gemv.json").write_text(json.dumps({"child_paths": {n: str(kernel / n) for n in files}}))
    launcher = root / "BBBB"
    launcher.mkdir()
    (launcher / "__triton_launcher.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF so")
    (root / "tmp.pid_1_x").mkdir()  # a compile in flight: not packed
    return root


@pytest.fixture
def shipped(tmp_path):
    """``(asset dir, index)``: the fake cache packed as the package ships it."""
    about = triton_cache.pack(_fake_cache(tmp_path / "made"), MACHINE, "h100", tmp_path / "assets")
    return tmp_path / "assets", about


def test_pack_keeps_what_triton_reads_back(shipped):
    assets, about = shipped
    assert about["identity"] == MACHINE and about["kernels"] == 1 and about["shared_objects"] == 1
    assert sorted(about["entries"]) == ["AAAA", "BBBB"]
    assert json.loads((assets / "h100.json").read_text())["archive"] == "h100.tar.gz"


def test_seeding_rewrites_the_group_index_to_the_new_cache(shipped, tmp_path):
    assets, _ = shipped
    archive, listed, _ = triton_cache.archive_for(MACHINE, assets)
    target = tmp_path / "fresh"
    assert triton_cache.seed_from(archive, target) == 2
    group = json.loads((target / "AAAA" / "__grp__gemv.json").read_text())["child_paths"]
    assert group == {"gemv.json": str(target / "AAAA" / "gemv.json"), "gemv.cubin": str(target / "AAAA" / "gemv.cubin")}
    assert all(Path(p).is_file() for p in group.values())
    assert not (target / "AAAA" / "gemv.ptx").exists()  # intermediate IRs are not shipped
    assert (target / "BBBB" / "__triton_launcher.cpython-311-x86_64-linux-gnu.so").read_bytes() == b"\x7fELF so"
    assert sorted(p.name for p in target.iterdir()) == ["AAAA", "BBBB"]  # no scratch left behind


def test_triton_finds_a_seeded_entry_through_its_cache_manager(shipped, tmp_path, monkeypatch):
    from triton.runtime.cache import FileCacheManager

    assets, _ = shipped
    target = tmp_path / "fresh"
    triton_cache.seed_from(triton_cache.archive_for(MACHINE, assets)[0], target)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(target))
    group = FileCacheManager("AAAA").get_group("gemv.json")
    assert group is not None and set(group) == {"gemv.json", "gemv.cubin"}


def test_entries_already_there_are_left_alone(shipped, tmp_path):
    assets, _ = shipped
    target = tmp_path / "used"
    (target / "AAAA").mkdir(parents=True)
    (target / "AAAA" / "gemv.json").write_text("mine")
    assert triton_cache.seed_from(triton_cache.archive_for(MACHINE, assets)[0], target) == 1  # BBBB only
    assert (target / "AAAA" / "gemv.json").read_text() == "mine"


def test_only_the_exact_machine_finds_an_archive(shipped):
    assets, _ = shipped
    assert triton_cache.archive_for(MACHINE, assets) is not None
    for other in (MACHINE.replace("3.6.0", "3.5.1"), MACHINE.replace("torch 2.11.0+cu130", "torch 2.12.0"),
                  MACHINE.replace("132sm", "114sm"), "cpu|torch 2.11.0|triton 3.6.0"):
        assert triton_cache.archive_for(other, assets) is None


def _seed_on(monkeypatch, assets, target, machine=MACHINE):
    """:func:`triton_cache.seed` as a CUDA device of ``machine`` with ``assets`` shipped and ``target`` as
    Triton's cache directory."""
    monkeypatch.setattr(triton_cache, "SHIPPED_DIR", assets)
    monkeypatch.setattr(triton_cache, "identity", lambda device: machine)
    monkeypatch.setattr(triton_cache, "_SEEDED", {})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(target))
    return triton_cache.seed(torch.device("cuda", 0))


def test_seed_fills_tritons_cache_once_a_process(shipped, tmp_path, monkeypatch):
    assets, _ = shipped
    target = tmp_path / "fresh"
    assert _seed_on(monkeypatch, assets, target) == 2
    assert triton_cache.seed("cuda:0") == 2 == triton_cache.seeded()  # remembered: the archive is not read again
    monkeypatch.setattr(triton_cache, "_SEEDED", {})
    assert triton_cache.seed("cuda:0") == 0  # a later process: every entry there, the archive stays shut


def test_seed_does_nothing_switched_off_elsewhere_or_on_another_machine(shipped, tmp_path, monkeypatch):
    assets, _ = shipped
    target = tmp_path / "fresh"
    monkeypatch.setenv(triton_cache.ENV, "off")
    assert _seed_on(monkeypatch, assets, target) == 0 and not target.exists()
    monkeypatch.delenv(triton_cache.ENV)
    assert _seed_on(monkeypatch, assets, target, machine=MACHINE + "x") == 0 and not target.exists()
    assert triton_cache.seed("cpu") == 0
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "my.remote:Cache")  # not plain files: left alone
    assert _seed_on(monkeypatch, assets, target) == 0 and not target.exists()


def test_a_broken_archive_costs_a_warning(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(triton_cache.log, "warning", lambda fmt, *args: seen.append(fmt % args))
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive")
    assert triton_cache.seed_from(bad, tmp_path / "cache") == 0
    assert seen and "compiled instead" in seen[0]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_a_steps_marker_is_per_machine_code_and_signature_and_travels_with_the_archive(tmp_path, monkeypatch):
    cache = tmp_path / "made"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setattr(triton_cache, "identity", lambda device: MACHINE)
    assert triton_cache.steps_marker("cpu", "qwen2") is None  # nothing is built ahead off CUDA
    marker = triton_cache.steps_marker("cuda:0", "qwen2")
    assert marker == triton_cache.steps_marker("cuda:0", "qwen2") != triton_cache.steps_marker("cuda:0", "llama")
    monkeypatch.setattr(triton_cache, "identity", lambda device: MACHINE + "x")
    assert triton_cache.steps_marker("cuda:0", "qwen2") != marker  # another machine
    monkeypatch.setattr(triton_cache, "identity", lambda device: MACHINE)
    assert marker.parent.parent == cache and not marker.exists()
    triton_cache.mark(marker, "qwen2")
    triton_cache.mark(marker, "qwen2")  # there already: left as it is
    assert json.loads(marker.read_text()) == {"signature": "qwen2"}
    assert [p.name for p in cache.iterdir()] == [marker.parent.name]  # no scratch left behind
    about = triton_cache.pack(cache, MACHINE, "h100", tmp_path / "assets")
    assert about["entries"] == [marker.parent.name] and about["kernels"] == 0
    fresh = tmp_path / "fresh"
    triton_cache.seed_from(triton_cache.archive_for(MACHINE, tmp_path / "assets")[0], fresh)
    assert (fresh / marker.parent.name / marker.name).read_text() == marker.read_text()


def test_a_marker_that_cannot_be_written_costs_nothing(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    triton_cache.mark(blocked / "entry" / "steps.json", "qwen2")  # no error
    assert blocked.read_text() == "not a directory"


def test_a_lanes_steps_signature_ignores_depth_only():
    """FastLane._steps_signature (the steps marker's key): two models of the same layer shapes but another number
    of layers share it (the shipped archive is made with one-layer models); another width or cache length does not."""
    import sys

    sys.path.insert(0, "tests")
    from tiny_models import make_model

    from hf_rstitch import Role
    from hf_rstitch.fast import FastConfig, FastLane

    config = FastConfig(max_bucket=4, graphs=False)

    def signature(hidden, layers, capacity=32):
        lane = FastLane(make_model("qwen2", hidden, layers, seed=0), Role.LLM, 96, capacity, config)
        return lane._steps_signature([(False, 1), (True, 4)])

    assert signature(32, 1) == signature(32, 3)
    assert signature(32, 1) != signature(64, 1)
    assert signature(32, 1) != signature(32, 1, capacity=1024)
    json.loads(signature(32, 1))


def test_a_lanes_steps_signature_ignores_virtual_joins_but_not_its_spare_rows():
    """``virtual_joins`` decides no kernel: a lane without spare rows (generate's) has the signature of one built
    with ``virtual_joins=0`` (what the shipped archives' markers were made with); a request engine's lane with
    spare rows has its own (its plan's batch buckets and its cache's rows)."""
    import sys

    sys.path.insert(0, "tests")
    from tiny_models import make_model

    from hf_rstitch import Role
    from hf_rstitch.fast import FastConfig, FastLane

    model = make_model("qwen2", 32, 1, seed=0)

    def signature(virtual_joins, max_rows=4, spare=0, kv_blocks=None):
        config = FastConfig(max_bucket=4, graphs=False, virtual_joins=virtual_joins)
        lane = FastLane(model, Role.LLM, 96, 32, config, max_rows=max_rows, kv_blocks=kv_blocks, spare_rows=spare)
        return lane._steps_signature([(False, 1), (True, 4)])

    assert signature(64) == signature(0) == signature(16)
    assert signature(64, max_rows=4 + 64, spare=64, kv_blocks=32) != signature(0, kv_blocks=32)


def test_an_index_says_which_kernel_code_it_was_made_from(shipped, monkeypatch):
    """Triton renames a kernel's entries when its module changes above it, and markers name the code whole: an
    archive made before a change to the kernels' sources is stale, one whose index does not say is unknown."""
    assets, about = shipped
    assert about["kernel_sources"] == triton_cache.kernels_hash()
    assert triton_cache.freshness(triton_cache.archive_for(MACHINE, assets)[2]) == "current"
    assert triton_cache.freshness({**about, "kernel_sources": "0" * 64}) == "stale"
    assert triton_cache.freshness({k: v for k, v in about.items() if k != "kernel_sources"}) == "unknown"


def test_the_kernels_hash_follows_every_kernel_module(tmp_path, monkeypatch):
    from hf_rstitch.fast.kernels import gemv

    copy = tmp_path / "kernels"
    copy.mkdir()
    for path in Path(gemv.__file__).parent.glob("*.py"):
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(triton_cache, "__file__", str(copy / "triton_cache.py"))
    triton_cache.kernels_hash.cache_clear()
    try:
        same = triton_cache.kernels_hash()
        (copy / "gemv.py").write_text((copy / "gemv.py").read_text() + "\n")  # a blank line shifts nothing, still new
        triton_cache.kernels_hash.cache_clear()
        assert triton_cache.kernels_hash() != same
    finally:
        monkeypatch.undo()
        triton_cache.kernels_hash.cache_clear()
    assert triton_cache.kernels_hash() == same  # the package's own, as before


def test_a_stale_archive_is_seeded_with_one_warning(shipped, tmp_path, monkeypatch):
    assets, about = shipped
    (assets / "h100.json").write_text(json.dumps({**about, "kernel_sources": "0" * 64}))
    seen = []
    monkeypatch.setattr(triton_cache.log, "warning", lambda fmt, *args: seen.append(fmt % args))
    assert _seed_on(monkeypatch, assets, tmp_path / "fresh") == 2  # entries of unchanged kernels still serve
    assert triton_cache.seed("cuda:0") == 2
    assert len(seen) == 1 and "h100.tar.gz" in seen[0] and "gpu_assets.sh" in seen[0]


def test_the_shipped_indices_name_their_kernel_code():
    """Every archive the package ships records the kernel code it was made from (tools/check_assets.py compares
    it)."""
    found = triton_cache.indices()
    assert found, "no shipped Triton archive"
    assert all(len(about.get("kernel_sources", "")) == 64 for _, about in found), [p.name for p, _ in found]
