"""Gradio imported the page process's way (hf_rstitch/ui/gradio_import.py) is the same Gradio: every component's
event listeners carry the docstrings a plain ``import gradio`` renders, while what the page process refuses stays
unimported."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("gradio", reason="the app needs Gradio")

LISTENERS = """
import json, sys
if sys.argv[1] == "page":
    from hf_rstitch.ui.gradio_import import gradio
    gradio(server=True)
else:
    import gradio
from gradio.components import Component
import gradio.components as C

docs = {}
for name in dir(C):
    cls = getattr(C, name)
    if isinstance(cls, type) and issubclass(cls, Component):
        for event in cls.EVENTS:
            event = event if isinstance(event, str) else event.event_name
            docs[f"{name}.{event}"] = getattr(cls, event).__doc__
print(json.dumps({"docs": docs, "modules": sorted(set(sys.argv[2:]) & set(sys.modules))}))
"""


def _listeners(how: str, modules: tuple[str, ...]) -> dict:
    done = subprocess.run([sys.executable, "-c", LISTENERS, how, *modules], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_page_process_gradio_has_plain_gradios_listener_docs_without_the_unused_imports():
    from hf_rstitch.ui.gradio_import import UNUSED

    page, plain = _listeners("page", UNUSED), _listeners("plain", UNUSED)
    assert len(page["docs"]) > 100 and all("{{" not in doc for doc in page["docs"].values() if doc)
    assert page["docs"] == plain["docs"]
    assert page["modules"] == []
