"""The model worker (hf_rstitch/ui/worker.py), as ``rstitch ui`` uses it: a pair loaded in a second process shows
what the in-process pair shows (the same info, the same frames), a pair that cannot load or a worker that dies is a
message and the next load starts a new worker; the page served on a worker runs generate's answer. Also the
frames' incremental token texts (hf_rstitch/ui/frames.py)."""

import os
import signal

import pytest

from hf_rstitch.toyworld.pair import assets_present
from hf_rstitch.ui.frames import Texts
from hf_rstitch.ui.pair import PairError
from hf_rstitch.ui.render import token_texts
from hf_rstitch.ui.run import RunError, RunSettings

needs_pair = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")


@needs_pair
def test_texts_of_a_growing_answer_are_token_texts_of_the_whole():
    from transformers import AutoTokenizer

    import hf_rstitch

    tok = AutoTokenizer.from_pretrained(hf_rstitch.shipped("llm"))
    ids = tok("Tom has 12 apples and buys 7 more. How many apples has he now? 19, as 12 + 7 = 19.")["input_ids"]
    texts = Texts(tok)
    for n in (0, 3, 4, 11, 12, len(ids)):
        assert texts(ids[:n]) == token_texts(tok, ids[:n])
    changed = ids[:9] + ids[:5]  # a prefix that changed (the final snapshot may differ from the live ones)
    assert texts(changed) == token_texts(tok, changed)


@pytest.fixture(scope="module")
def worker():
    from hf_rstitch.ui.worker import Worker

    got = Worker({("shipped:llm", "shipped:slm"): "shipped"})
    yield got
    got.close()


@pytest.fixture(scope="module")
def local():
    import torch

    from hf_rstitch.ui.pairs import Pairs

    torch.set_num_threads(1)
    return Pairs()


@pytest.fixture(scope="module")
def problem():
    from hf_rstitch.toyworld.pair import load_test_split

    return load_test_split()[0]["problem"]


KEY = ("shipped:llm", "shipped:slm")


@pytest.mark.slow
@needs_pair
def test_a_pair_in_the_worker_shows_what_it_shows_in_process(worker, local, problem):
    assert worker.ready(None, None) == local.ready(None, None)
    settings = RunSettings(problem, 0.001, 60).checked()
    remote, here = list(worker.frames(KEY, settings, True)), list(local.frames(KEY, settings, True))
    for pane in ("stitched", "llm"):
        a, b = ([f for f in frames if f.pane == pane] for frames in (remote, here))
        assert a[-1].snap.done and a[-1].texts == b[-1].texts and a[-1].code == b[-1].code
        assert (a[-1].snap.ids, a[-1].snap.roles, a[-1].snap.summary) == (b[-1].snap.ids, b[-1].snap.roles,
                                                                           b[-1].snap.summary)


@pytest.mark.slow
@needs_pair
def test_pairs_that_cannot_load_are_messages_and_the_worker_keeps_serving(worker, tmp_path, problem):
    import hf_rstitch
    from tiny_models import make_tokenizer

    with pytest.raises(PairError, match="cannot load the pair"):
        worker.ready("nobody-xyz/no-such-model-rstitch", "shipped:slm")  # HF_HUB_OFFLINE=1 in the test commands
    make_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((hf_rstitch.shipped("slm") / "config.json").read_text())
    with pytest.raises(PairError, match="tokenizers differ"):
        worker.ready("shipped:llm", str(tmp_path))
    last = list(worker.frames(KEY, RunSettings(problem, 0.02, 8).checked(), False))[-1]
    assert last.snap.done and len(last.snap.ids) == 8


@pytest.mark.slow
@needs_pair
def test_a_worker_that_dies_is_a_message_and_the_next_load_starts_another(worker, problem, monkeypatch):
    worker.ready(None, None)
    send = worker._send

    def send_then_die(*message):  # the worker dies as soon as it has the run: before the run can end (killed after
        send(*message)            # its first frame instead, a short answer could end first on a loaded machine)
        if message[0] == "run":
            os.kill(worker.process.pid, signal.SIGKILL)

    monkeypatch.setattr(worker, "_send", send_then_die)
    with pytest.raises(RunError, match="model worker stopped"):
        list(worker.frames(KEY, RunSettings(problem, 0.001, 2000).checked(), False))
    monkeypatch.undo()
    assert worker.ready(None, None).router == "shipped"  # a new worker, the first pair's router kept
    assert list(worker.frames(KEY, RunSettings(problem, 0.02, 4).checked(), False))[-1].snap.done


PAGE = """
import json, sys
from gradio_client import Client
from hf_rstitch.cli.ui import free_port
from hf_rstitch.ui.page import build

blocks, start_loading = build(None, None, None, worker=True)
_, url, _ = blocks.launch(server_name="127.0.0.1", server_port=free_port("127.0.0.1"), prevent_thread_lock=True,
                          quiet=True)
start_loading()
out = Client(url, verbose=False).predict(sys.argv[1], 0.001, 60, "greedy", 0, False, False, api_name="/run")
print("RESULT", json.dumps([out[:6], sorted(m for m in ("torch", "transformers") if m in sys.modules)]))
blocks.close()
"""


@pytest.mark.slow
@needs_pair
def test_the_page_served_on_a_worker_runs_generates_answer_without_importing_torch(local, problem, text_of):
    """``rstitch ui``'s page (hf_rstitch/ui/page.py ``serve``) in a process of its own, as the command runs it."""
    pytest.importorskip("gradio", reason="the app needs Gradio")
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PAGE, problem], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out, modules = json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")))
    got = dict(zip(("message", "stitched", "clock_stitched", "llm", "clock_llm", "plot"), out))
    last = list(local.frames(KEY, RunSettings(problem, 0.001, 60), False))[-1]
    assert got["message"] == "" and text_of(got["stitched"]) == "".join(last.texts)
    assert "tok-slm" in got["stitched"] and "tok-llm" in got["stitched"]
    assert 'class="threshold"' in got["plot"] and "(done)" in got["clock_stitched"]
    assert modules == []  # the worker imported them, the page's process did not
