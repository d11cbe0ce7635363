"""``rstitch export-hub-template DIR --space``: the Space's files, and its app.py served from a venv with only its
requirements (hf_rstitch/ui/space.py)."""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hf_rstitch.cli.main import main
from hf_rstitch.toyworld.pair import assets_present
from hf_rstitch.ui.space import REQUIREMENTS, export_space

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_requirements_are_pyprojects_dependencies_and_ui_extra():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert REQUIREMENTS == (*project["dependencies"], *project["optional-dependencies"]["ui"])


def test_the_space_has_app_requirements_readme_and_the_package(tmp_path, capsys):
    assert main(["export-hub-template", str(tmp_path / "space"), "--space"]) == 0
    out = tmp_path / "space"
    front = (out / "README.md").read_text().split("---")[1]
    assert "sdk: gradio" in front and "app_file: app.py" in front
    assert (out / "requirements.txt").read_text().split() == list(REQUIREMENTS)
    compile((out / "app.py").read_text(), "app.py", "exec")
    assert "'shipped:llm', 'shipped:slm'" in (out / "app.py").read_text()
    assert (out / "hf_rstitch" / "ui" / "page.py").is_file() and (out / "hf_rstitch" / "assets" / "pair").is_dir()
    assert not list(out.rglob("__pycache__"))


def test_a_hub_pair_space_leaves_the_shipped_weights_out(tmp_path):
    out = export_space(tmp_path / "space", "org/llm", "org/slm")
    assert "'org/llm', 'org/slm'" in (out / "app.py").read_text()
    assert not (out / "hf_rstitch" / "assets" / "pair").exists()


@pytest.mark.parametrize("argv, message", [
    (["--space", "--llm", "org/llm"], "both --llm and --slm"),
    (["--space", "--threshold", "0.1"], "does not apply to --space"),
])
def test_bad_space_options_are_messages(tmp_path, capsys, argv, message):
    assert main(["export-hub-template", str(tmp_path / "space"), *argv]) == 2
    assert message in capsys.readouterr().err


def _free_port() -> int:
    from hf_rstitch.cli.ui import free_port

    return free_port("127.0.0.1")


def _wait_until_served(url: str, proc: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"app.py exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as page:
                if page.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"app.py did not serve {url} within {timeout_s} s")


@pytest.mark.slow
@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
def test_the_spaces_app_serves_from_a_venv_with_only_its_requirements(tmp_path):
    """The Space's app.py, run by a fresh venv's python from the Space's folder, answers a run.

    Honest limits: the venv is made with ``--system-site-packages``, because torch, transformers and Gradio cannot
    be installed offline into an empty venv (no test downloads), and ``--without-pip`` (the pip and the old
    setuptools a venv bundles would shadow the installed ones torch requires; ``python -m pip`` finds the installed
    pip). ``pip install --no-index -r requirements.txt`` in it must then succeed from what is already installed, so
    requirements.txt names nothing pip could not find, and hf_rstitch is imported from the Space's own copy
    (checked), not from the checkout or an install of it.
    """
    pytest.importorskip("gradio_client")
    space = export_space(tmp_path / "space")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PIP_NO_INDEX="1")
    pip = subprocess.run([python, "-m", "pip", "install", "--no-index", "-r", "requirements.txt"], cwd=space, env=env,
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    where = subprocess.run([python, "-c", "import hf_rstitch; print(hf_rstitch.__file__)"], cwd=space, env=env,
                           capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).resolve().is_relative_to(space.resolve()), where.stdout + where.stderr
    port = _free_port()
    env.update(GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port))
    proc = subprocess.Popen([python, "app.py"], cwd=space, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        _wait_until_served(f"http://127.0.0.1:{port}/", proc)
        from gradio_client import Client

        out = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            "Tom has 12 apples and buys 7 more. How many apples does he have?", 0.01, 40, "greedy", 0, False, False,
            api_name="/run")
        assert out[0] == "" and "tok-slm" in out[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
