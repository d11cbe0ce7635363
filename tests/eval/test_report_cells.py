"""A method label or dataset name from a records file cannot break report.md's tables or inject HTML."""

from hf_rstitch.eval.report import md_cell, table1_markdown, token_table_markdown


def test_labels_from_records_are_escaped():
    assert md_cell("a|b\n<script>`x`") == "a\\|b &lt;script&gt;\\`x\\`"
    stats = {"label": "evil|<img src=x>", "kind": None, "param": None, "acc": 1.0, "latency_s": 1.0, "speedup": 1.0,
             "llm_tokens": 1, "slm_tokens": 1, "total_tokens": 2, "token_reduction_pct": None, "switches": 0, "n": 1}
    table = table1_markdown({"d|s": {"m": stats}})
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert all(line.replace("\\|", "").count("|") == rows[0].replace("\\|", "").count("|") for line in rows)
    assert "<img" not in table and "evil\\|&lt;img" in table
    assert "<img" not in token_table_markdown({"m": stats}, "d<s>")
