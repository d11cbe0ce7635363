"""The README's promises (issue 47): its first screen is what a newcomer runs first -- install for CPU and CUDA, the
offline demo, a Python snippet on the shipped pair that runs anywhere --; numbers live in docs/benchmarks.md; the
two set-up commands are the ones the Makefile and CI run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LINES = README.splitlines()


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def line_of(needle: str) -> int:
    return next(i for i, line in enumerate(LINES, start=1) if needle in line)


def test_short_with_install_then_the_offline_demo_first():
    assert len(LINES) < 150
    assert line_of("## Install") < line_of("rstitch demo") <= 40
    assert line_of("## In Python, on the shipped pair") < line_of("## The same call on a Hub pair") < \
        line_of("## What you get")
    what = README.split("## What you get", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in what.splitlines() if b.startswith("- ")]
    assert len(bullets) >= 8 and all("](" in b for b in bullets)  # one line each, with a link


def test_install_says_how_to_get_the_cpu_build_and_what_make_pins():  # item 1
    install = code_blocks(README.split("## Install", 1)[1].split("\n## ", 1)[0], "bash")[0]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in install
    assert re.search(r"^pip install \"\.\[eval\]\"", install, flags=re.M)  # the CUDA line: PyPI's torch
    pin = re.search(r"^TORCH \?= (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert f"`{pin}`" in README


def test_the_two_set_up_commands_are_the_makefiles_and_ci_runs_the_test_one():
    bash = [c.strip() for c in code_blocks(README, "bash")]
    demo = next(c for c in bash if c.startswith("make demo"))
    test = next(c for c in bash if c.startswith("make test"))
    assert test == "make test" and demo.split()[:2] == ["make", "demo"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: install\n\tHF_HUB_OFFLINE=1 \$\(PYTHON\) -m hf_rstitch demo$", makefile, flags=re.M)
    assert re.search(r"^test: install-dev$", makefile, flags=re.M)
    assert re.search(r"^make test$", (ROOT / ".ci/run").read_text(), flags=re.M)


def test_numbers_live_in_the_benchmarks_page():
    assert not any(line.startswith("|") for line in LINES), "tables belong in docs/benchmarks.md"
    assert "](docs/benchmarks.md)" in README
    assert not re.search(r"\d+(\.\d+)?x (faster|its)|\d ms\b|tokens/s", README)
    pointers = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                if p.name != "benchmarks.md" and "git show" in p.read_text()]
    assert pointers == [], "git history pointers belong in docs/benchmarks.md (retired scripts)"


def test_the_readme_and_getting_started_show_one_snippet_on_the_shipped_pair():
    index = (ROOT / "docs/index.md").read_text()
    shipped = [c for c in code_blocks(README, "python") if "load_pair()" in c]
    assert len(shipped) == 1 and shipped[0] in code_blocks(index, "python")
    assert "stitch_threshold=0.02" in shipped[0]


@pytest.mark.slow  # loads and runs the pair in a fresh process: ~10 s on 2 cores
@pytest.mark.skipif(not (ROOT / "hf_rstitch/assets/pair/llm/model.safetensors").exists(), reason="no shipped pair")
def test_the_shipped_pair_snippet_runs_offline_answers_right_on_one_thread(tmp_path):  # item 9
    from hf_rstitch.toyworld.tasks import example_row

    (snippet,) = [c for c in code_blocks(README, "python") if "load_pair()" in c]
    script = tmp_path / "snippet.py"
    script.write_text(snippet + "\nimport torch\nprint('threads', torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the library picks, as the CLI does
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"\\boxed{{{example_row()['answer']}}}" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "threads 1"
