"""``transformers serve --trust-remote-code`` on a model repo carrying the exported template, in a venv
where hf-rstitch cannot be imported, on loopback: the chat completion is the stitched decode.

Slow (a venv, a server start, two models): ``pytest -m slow tests/docs/test_hub_serve.py``. Needs
transformers' serving extra (fastapi, uvicorn, openai); skipped without it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import pytest

from hf_rstitch import shipped
from hf_rstitch.hub_template import export
from hf_rstitch.toyworld.pair import assets_present

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")]
TAU, NEW = 0.02, 40  # at this tau the SLM writes most of the answer: the reply differs from the LLM alone
QUESTION = "Tom has 12 apples and buys 7 more. How many apples does he have?"

BLOCKER = '''import importlib.abc, sys

class _NoHfRstitch(importlib.abc.MetaPathFinder):  # this venv sees the system's packages, but not hf-rstitch
    def find_spec(self, name, path=None, target=None):
        if name == "hf_rstitch" or name.startswith("hf_rstitch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, _NoHfRstitch())
'''


def _venv_without_hf_rstitch(root: Path) -> Path:
    venv.create(root, system_site_packages=True, with_pip=False)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_no_hf_rstitch.py").write_text(BLOCKER)
    (Path(site) / "zz_no_hf_rstitch.pth").write_text("import _no_hf_rstitch\n")
    check = subprocess.run([str(python), "-c", "import hf_rstitch"], capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'hf_rstitch'" in check.stderr
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def _wait_up(url: str, server: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"transformers serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"transformers serve did not answer {url} within {seconds} s")


def test_transformers_serve_stitches_one_request(tmp_path, pair):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    llm, slm, tok = pair
    inputs = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    want = llm.generate(**inputs, assistant_model=slm, stitch_threshold=TAU, max_new_tokens=NEW,
                        return_dict_in_generate=True)
    assert want.stitch.llm_tokens > 0 and want.stitch.slm_tokens > 0
    text = tok.decode(want.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    plain = llm.generate(**inputs, max_new_tokens=NEW)  # the LLM alone writes something else
    assert tok.decode(plain[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True) != text

    repo = export(tmp_path / "repo", llm="shipped:llm", slm=str(shipped("slm")), threshold=TAU)
    python = _venv_without_hf_rstitch(tmp_path / "venv")
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(python), "-m", "transformers.cli.transformers", "serve", str(repo), "--trust-remote-code",
         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    try:
        _wait_up(f"http://127.0.0.1:{port}/health", server)
        reply = _post(f"http://127.0.0.1:{port}/v1/chat/completions", {
            "model": str(repo), "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": NEW, "temperature": 0, "stream": False})
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert reply["choices"][0]["message"]["content"] == text, (tmp_path / "serve.log").read_text()[-3000:]
