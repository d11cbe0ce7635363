"""benchmarks/join_profile.py: device operations are charged to the innermost range that launched them, and the
table lists the operations of the ranges asked for."""


def _trace():
    """A chrome trace by hand: a step holding an SLM call and a join; two kernels launched in each part."""
    ann = lambda name, ts, dur: {"cat": "user_annotation", "ph": "X", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    launch = lambda ts, corr: {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts,  # noqa: E731
                               "args": {"correlation": corr}}
    kernel = lambda name, ts, dur, corr: {"cat": "kernel", "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                          "args": {"correlation": corr}}
    return {"traceEvents": [
        ann("step", 0, 100), ann("advance:slm", 10, 30), ann("join", 50, 40),
        launch(12, 1), kernel("gemv_kernel<bf16>", 200, 20, 1), launch(14, 2), kernel("rms_norm", 220, 5, 2),
        launch(52, 3), kernel("gemm_kernel", 300, 50, 3), launch(95, 4), kernel("sample", 400, 2, 4)]}


def test_operations_go_to_the_innermost_range_and_the_table_lists_the_ranges_asked_for():
    from join_profile import attribute, markdown

    ranges = attribute(_trace())
    assert ranges["advance:slm"]["device_busy_ms"] == 0.025 and ranges["advance:slm"]["launches"] == 1 + 1
    assert ranges["join"]["top_ops_ms_per_call"] == {"gemm_kernel": 0.05}
    assert ranges["step"]["top_ops_ms_per_call"] == {"sample": 0.002}  # launched in the step, outside its parts
    row = {"method": "stitched", "concurrency": 8, "ranges": {k: v for k, v in ranges.items() if k != "outside_ranges"},
           "outside_ranges": ranges["outside_ranges"]}
    doc = {"gpu": "test", "pair": "p", "scale": 0.05, "steps": 1, "warmup_s": 1.0, "bandwidth_gb_s": 4000.0,
           "floor_ms": {"llm": 3.6, "slm": 0.7}, "rows": [row], "kernels": ["join", "advance:slm"]}
    text = markdown(doc)
    assert "Device operations of `join`" in text and "`gemm_kernel` 0.050" in text
    assert "Device operations of `advance:slm`" in text and "`gemv_kernel` 0.020; `rms_norm` 0.005" in text
    assert "Device operations of `step`" not in text
