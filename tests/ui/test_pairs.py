"""The page's pairs (hf_rstitch/ui/pairs.py ``Pairs``): each loads once in the background, a reference that names no
pair is refused at once, a load that failed is retried when asked again; the page is built without torch."""

import subprocess
import sys
import threading

import pytest

from hf_rstitch.ui import pairs as ui_pairs
from hf_rstitch.ui.pair import PairError


@pytest.fixture
def loads(monkeypatch):
    """Pretend loads (no model): each call recorded; the references in ``failing`` fail once."""
    calls, failing = [], set()

    def load(llm, slm, router=None):
        calls.append((llm, slm, router))
        if (llm, slm) in failing:
            failing.discard((llm, slm))
            raise PairError(f"cannot load {llm}")
        return (llm, slm, router)

    monkeypatch.setattr(ui_pairs, "load", load)
    monkeypatch.setattr(ui_pairs, "_warm_up", lambda pair, table: None)
    return calls, failing


def test_a_pair_loads_once_for_every_asker(loads):
    calls, _ = loads
    pairs = ui_pairs.Pairs(routers={("shipped:llm", "shipped:slm"): "shipped"})
    got = []
    threads = [threading.Thread(target=lambda: got.append(pairs.get(None, None))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pairs.get("shipped:llm ", " shipped:slm") == got[0] == ("shipped:llm", "shipped:slm", "shipped")
    assert got == [got[0]] * 4 and calls == [("shipped:llm", "shipped:slm", "shipped")]


def test_references_that_name_no_pair_are_refused_before_any_load(loads, tmp_path):
    calls, _ = loads
    pairs = ui_pairs.Pairs()
    with pytest.raises(PairError, match="give both an LLM and an SLM"):
        pairs.start("shipped:llm", None)
    with pytest.raises(PairError, match="no such folder"):
        pairs.start(str(tmp_path / "missing"), "shipped:slm")
    assert calls == []


def test_a_load_that_failed_is_retried(loads):
    calls, failing = loads
    failing.add(("shipped:llm", "shipped:slm"))
    pairs = ui_pairs.Pairs()
    with pytest.raises(PairError, match="cannot load shipped:llm"):
        pairs.get(None, None)
    assert pairs.get(None, None)[:2] == ("shipped:llm", "shipped:slm") and len(calls) == 2


@pytest.mark.slow
def test_the_page_is_built_without_torch_or_transformers():
    """``rstitch ui`` serves the page before torch and transformers load (hf_rstitch/ui/page.py ``serve``)."""
    pytest.importorskip("gradio", reason="the app needs Gradio")
    code = ("import sys\nfrom hf_rstitch.ui.page import build\nbuild(None, None, None)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"
