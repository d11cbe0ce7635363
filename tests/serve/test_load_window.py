"""The serving benchmarks' counting rules (benchmarks/serve_clients.py, serve_reasoning.py), on hand-made records:
a window counts the requests completed in it and the tokens streamed in it, for every method alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve_clients as sc  # noqa: E402
import serve_reasoning as sr  # noqa: E402


def rec(start, end, chunks, complete=True, status=200, error=None, target=None):
    return {"start": start, "end": end, "chunks": chunks, "complete": complete, "status": status, "error": error,
            "ttft_s": chunks[0][0] - start if chunks else None,
            "target": sum(n for _, n in chunks) if target is None else target}


def test_window_counts_tokens_and_request_shares_inside_it():
    records = [rec(0.0, 1.5, [(0.5, 1), (1.0, 1), (1.5, 1)]),  # before the window: nothing counted
               rec(1.0, 3.0, [(1.5, 1), (2.0, 2), (3.0, 1)]),  # completes inside: 3 of its 4 tokens inside
               rec(2.5, 6.0, [(3.5, 4), (5.5, 1)], target=8),  # ends after: 4 of its 8 tokens inside
               rec(2.0, 2.8, [(2.4, 1)], complete=False, status=503, error="replica lost", target=2)]
    s = sc.summarize(records, 2.0, 4.0)
    assert s["completed"] == 1 and s["completed_per_s"] == 0.5
    assert s["requests_per_s"] == pytest.approx((3 / 4 + 4 / 8 + 1 / 2) / 2.0)  # shares, not whole completions
    assert s["tokens_per_s"] == (2 + 1 + 4 + 1) / 2.0
    assert s["p50_s"] == 2.0 and s["errors"] == 1 and s["statuses"] == [503]
    assert s["ttft_p50_s"] == 1.0  # first tokens inside the window (2.5 + 1.0); the first one (1.5) came before it


def test_request_shares_read_as_completions_in_a_steady_state():
    """Back-to-back requests of 4 tokens, one a second: 0.25 requests/s whatever the window's phase."""
    records = [rec(t, t + 4, [(t + k + 1, 1) for k in range(4)]) for t in range(0, 40, 4)]
    for t0 in (8.0, 8.5, 9.3):
        s = sc.summarize(records, t0, t0 + 6)
        assert s["requests_per_s"] == pytest.approx(s["tokens_per_s"] / 4)


def test_shapes_scale_both_methods_alike():
    shape = sr.shapes(0.1, n=64)
    assert shape["prompt"] == round(128 * 0.1)
    for a, b in zip(shape["llm_only"], shape["stitched"]):  # request i: the same spread factor for both methods
        assert a / b == pytest.approx(2753 / 1115, rel=0.1)
    assert sum(shape["llm_only"]) / 64 == pytest.approx(275.3, rel=0.15)
    assert shape["llm_share"] == pytest.approx(344 / 1115)


def test_replayed_routes_repeat_per_slot():
    from hf_rstitch.core.policies import StepView

    policy = sr.replay_policy(slots=3, llm_share=0.31, device=None, width=64)
    rows = torch.tensor([2, 0])
    at = lambda i: policy.hand_to_llm(StepView(index=i, entropy=torch.zeros(2), rows=rows)).tolist()  # noqa: E731
    assert [at(i) for i in range(64)] == [at(i + 64) for i in range(64)]
    share = policy._llm.float().mean().item()
    assert share == pytest.approx(0.31, abs=0.02)


def test_any_long_window_of_the_default_routes_reads_maths_llm_share():
    """The routes follow the engine's step count: with one row, a window reads the stretch its steps fall on. Every
    window of 1,100 steps (3 s at 1 client on an H200) of each slot's default route is within 0.7 points of MATH's
    share, so that a server's window and its engine alone's read the same mix."""
    share = sr.shapes(0.05)["llm_share"]
    policy = sr.replay_policy(slots=4, llm_share=share, device=None)
    table = policy._llm.float()
    assert table.shape[1] == sr.ROUTE_STEPS and table.mean().item() == pytest.approx(share, abs=0.002)
    cycled = table.repeat(1, 1100 // sr.ROUTE_STEPS + 2)
    windows = cycled.unfold(1, 1100, 1)[:, :sr.ROUTE_STEPS].mean(-1)  # every start within a cycle
    assert (windows - share).abs().max().item() < 0.007


def run_doc(method, date, scale=0.9, skipped=(), gpu="NVIDIA H200"):
    """A serve_reasoning results document as a run with one method measured writes it."""
    row = {"concurrency": 256, "method": method, "requests_per_s": {"llm_only": 5.0, "stitched": 12.5}[method],
           "tokens_per_s": 1e4, "p50_s": 1.0, "p99_s": 2.0, "ttft_p50_s": 0.1, "engine_alone_tokens_per_s": 1e4}
    args = {"scale": scale, "warmup_s": 30.0, "window_s": 20.0, "decisions": "device", "join_wait": 4, "join_group": 8,
            "frontend_procs": 1, "engine": "auto", "dtype": "bfloat16", "fast": [], "methods": [method],
            "out_dir": "/tmp/out", "tag": f"_math_{method}"}
    return {"command": f"python benchmarks/serve_reasoning.py --scale {scale} --methods {method} --out-dir /tmp/out",
            "date": date, "gpu": gpu, "pair": "random Qwen2 7B / 1.5B, bfloat16", "prompt_tokens": 115,
            "llm_share": 0.31, "mean_tokens": {"llm_only": 2507, "stitched": 1016}, "args": args, "rows": [row],
            "skipped": list(skipped), "details": {f"{method}@256": {"server": {"completed": 9}}}, "phases": {}}


def test_merge_makes_one_table_of_runs_made_a_method_a_call(tmp_path):
    import json

    first = run_doc("llm_only", "d1", skipped=[{"concurrency": 256, "method": "stitched", "reason": "time budget"}])
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, doc in zip(paths, (first, run_doc("stitched", "d2"))):
        path.write_text(json.dumps(doc))
    text = sr.merge([str(p) for p in paths], tmp_path, "_math")
    merged = json.loads((tmp_path / "serve_reasoning_nvidia_h200_split_math.json").read_text())
    assert [(r["method"], r["concurrency"]) for r in merged["rows"]] == [("llm_only", 256), ("stitched", 256)]
    assert merged["skipped"] == []  # the stitched row measured by the second run replaces the first run's skip
    assert merged["args"]["methods"] == ["llm_only", "stitched"]
    assert [s["date"] for s in merged["sources"]] == ["d1", "d2"]
    assert "| 256 | stitched | 12.50 |" in text and "| 2.50x |" in text
    table = (tmp_path / "serve_reasoning_nvidia_h200_split_math.md").read_text()
    assert table.count("gpu_i48.sh serve") == 2 and table.rstrip().splitlines()[-1].startswith("Regenerate: `python")  # each call, then the merge
    assert (tmp_path / "serve_reasoning_nvidia_h200_split_math.png").exists()


def test_merge_orders_the_phase_table_by_method_then_clients(tmp_path):
    """Runs merged in any order (a level measured again in a later call) give one phase table, by method and then by
    clients as numbers (8 before 64)."""
    import json

    def phases(step_ms):
        lane = {"calls_per_step": 1.0, "ms_per_step": 1.0, "share": 0.5, "batch": 8, "rows": 8, "columns": 1.0}
        return {"step_ms": step_ms, "slm": lane, "llm": lane, "joins": {"ms_per_step": 0.0, "share": 0.0},
                "other": {"ms_per_step": 0.1, "share": 0.05}, "ahead_share": 1.0}

    docs = [run_doc("llm_only", "d1"), run_doc("stitched", "d2")]
    docs[0]["phases"] = {"stitched@64": phases(7.0), "llm_only@8": phases(4.0)}
    docs[1]["phases"] = {"llm_only@64": phases(5.0), "stitched@8": phases(6.0), "stitched@64": phases(6.9)}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, doc in zip(paths, docs):
        path.write_text(json.dumps(doc))
    text = sr.merge([str(p) for p in paths], tmp_path, "_math")
    merged = json.loads((tmp_path / "serve_reasoning_nvidia_h200_split_math.json").read_text())
    assert list(merged["phases"]) == ["llm_only@8", "llm_only@64", "stitched@8", "stitched@64"]
    assert merged["phases"]["stitched@64"]["step_ms"] == 6.9  # the later call's
    rows = [line.split(" | ")[:2] for line in text.splitlines() if line.startswith(("| llm_only |", "| stitched |"))]
    assert rows == [["| llm_only", "8"], ["| llm_only", "64"], ["| stitched", "8"], ["| stitched", "64"]]


@pytest.mark.parametrize("field, other", [("gpu", {"gpu": "NVIDIA H100"}), ("args.scale", {"scale": 0.05})])
def test_merge_refuses_runs_of_different_questions_naming_the_field(tmp_path, field, other):
    import json

    docs = [run_doc("llm_only", "d1"), run_doc("stitched", "d2", **other)]
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, doc in zip(paths, docs):
        path.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match=f"{field} = .* not runs of one question"):
        sr.merge([str(p) for p in paths], tmp_path, "_math")


@pytest.mark.parametrize("slow, starts", [(True, 1), (False, 3)])
def test_a_server_that_starts_slowly_is_not_retried_with_fewer_rows(monkeypatch, tmp_path, slow, starts):
    """A start that runs out of --startup-s names the flag and is not retried (fewer rows would not start it
    faster); one that exits is retried at half the rows until the same failure repeats."""
    calls = []

    def start(cfg, out, timeout_s):
        calls.append(cfg["max_batch"])
        return None, "not healthy" if slow else f"exited with {cfg['max_batch'] > 4}", slow

    monkeypatch.setattr(sr, "start_server", start)
    args = sr.argparse.Namespace(levels=[1, 8], max_batch=None, warmup_s=1.0, window_s=1.0, startup_s=60.0,
                                 dry_run_cpu=True, device="cpu", dtype="float32", engine="default", fast=[],
                                 decisions="device", join_wait=None, join_group=None, stream_interval=None,
                                 stream_writes_per_s=None, standin=False)
    rows, skipped, _ = sr.run_method("stitched", args, sr.shapes(0.01), tmp_path, sr.lab.Budget(1000))
    assert len(calls) == starts and calls[0] == 8 and rows == []
    assert [s["concurrency"] for s in skipped] == [1, 8]


def test_spy_reads_each_processs_threads_share_of_the_gil(tmp_path):
    """benchmarks/spy.py on py-spy's raw output (--subprocesses --threads): leading process frames name the
    process (the spawned engine process apart from the server), the next frame the thread; shares are of the
    samples taken while that process held the GIL."""
    import spy

    server = 'process 10:"python serve_reasoning.py --serve-worker {}"'
    child = 'process 11:"python -B -c from multiprocessing.spawn import spawn_main"'
    raw = tmp_path / "spy.txt"
    raw.write_text("\n".join([
        f"{server};{child};thread (1): rstitch-engine;Thread.run (threading.py:1);step (requests.py:9) 90",
        f"{server};{child};thread (2): rstitch-link-write;_write (split.py:1);post (split.py:2) 6",
        f"{server};{child};thread (2): rstitch-link-write;_write (split.py:1);figures (split.py:3) 4",
        f"{server};thread (3): MainThread;run (uvicorn.py:1) 5",
        f'{server};process 12:"python -c from multiprocessing.resource_tracker import main";thread (4): MainThread;'
        "main (resource_tracker.py:1) 2",
        "a line that is not a stack",
    ]) + "\n")
    s = spy.summary(raw)
    assert s["spawned child"]["samples"] == 100 and s["server"]["samples"] == 5
    writer = s["spawned child"]["threads"]["rstitch-link-write"]
    assert writer["share"] == pytest.approx(0.10) and writer["top"] == [["post", 0.6], ["figures", 0.4]]
    assert spy.lines(s)[0] == "spawned child (100 samples): rstitch-engine 90%, rstitch-link-write 10%"
    assert s["child: python -c from multiprocessing.resource_"]["samples"] == 2  # not merged into the server's
    assert "no recording" in spy.summary(tmp_path / "missing.txt")
