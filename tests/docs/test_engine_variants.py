"""benchmarks/engine_variants.py: its variants parse as the engine's join settings, and its CPU dry run writes the
results it names."""

import json

import pytest


def test_variants_parse_into_engine_and_fast_config_fields():
    from engine_variants import parse_variant

    assert parse_variant("default") == ({}, {})
    assert parse_variant("join_wait=4,join_group=6") == ({"join_wait": 4, "join_group": 6}, {})
    assert parse_variant("prefill_chunk=512,fast.compact_rows=true") == ({"prefill_chunk": 512}, {"compact_rows": True})
    for bad in ("join_wait", "join_wait=x", "warp=3", "fast.nope=1"):
        with pytest.raises(SystemExit):
            parse_variant(bad)


def test_the_engines_own_switches_parse_as_engine_fields():
    from engine_variants import parse_variant

    assert parse_variant("join_ahead=0,after_read=0") == ({"join_ahead": 0, "after_read": 0}, {})


@pytest.mark.slow
def test_the_cpu_dry_run_writes_every_variant_and_method(tmp_path):
    import torch

    from engine_variants import main

    torch.set_num_threads(1)  # the box's other processes: several threads a process thrash

    assert main(["--dry-run-cpu", "--out-dir", str(tmp_path), "--variants", "default", "join_wait=2"]) == 0
    doc = json.loads((tmp_path / "engine_variants_cpu.json").read_text())
    assert {(r["variant"], r["method"]) for r in doc["rows"]} == {
        (v, m) for v in ("default", "join_wait=2") for m in ("llm_only", "stitched")}
    assert all(r["errors"] == 0 and r["tokens_per_s"] > 0 for r in doc["rows"])
    assert (tmp_path / "engine_variants_cpu.md").exists() and (tmp_path / "engine_variants_cpu.png").exists()
