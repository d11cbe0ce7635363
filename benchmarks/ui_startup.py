"""How soon `rstitch ui` is usable, and how soon a run shows its first tokens, in a real browser.

    PYTHONPATH=. python benchmarks/ui_startup.py [--repeats 5] [--out benchmarks/results/ui_startup_cpu]
    nice -n -10 env PYTHONPATH=. python benchmarks/ui_startup.py ...   # ahead of the machine's other jobs (root)

Each repeat starts a fresh ``python -m hf_rstitch ui --port P`` (the shipped pair, offline, CPU) and, in headless
Chromium already running (Debian's chromium + chromium-driver, driven by selenium), measures from the moment the
process starts:

* ``http_s``: the server answers ``GET /``;
* ``page_s``: the page has rendered and its prompt box takes typing (Run reads "Loading models…" while the pair
  loads in the server's background);
* ``ready_s``: Run is enabled: the pair has loaded and warmed up, a click runs (the issue's "interactive");
* ``page_cpu_s``: CPU seconds the page's process had used at ``page_s``; ``server_cpu_s``: the page's process and
  its model worker (``rstitch ui`` loads the pair in a second process) at ``ready_s`` (user + system, all threads):
  on a busy machine wall clocks stretch with the load, CPU time much less so;

then, ``--settle`` seconds later (a reader typing), presses Run (the page's defaults) and measures from the click:

* ``first_token_s``: the first coloured token is in the page; ``done_s``: the run's clock says done;
* the same for a second run (``warm_first_token_s``).

Prints a table and writes JSON + markdown (device, versions, load average, the process's niceness, date). Targets
(issue 52): ready < 5 s, first tokens < 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from lab import RESULTS, device_name, environment, write_result

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[1]


def browser():
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a process (all its threads), with its live descendants' (``children``: the
    model worker), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it ended
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if not children:
        return own
    kids = [int(k) for task in Path(f"/proc/{pid}/task").iterdir()
            for k in (task / "children").read_text().split()]
    return own + sum(cpu_seconds(k, True) for k in kids)


def wait(predicate, timeout: float, poll: float = 0.02):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(poll)
    raise TimeoutError(f"gave up after {timeout:.0f} s")


def served(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as page:
            return page.status == 200
    except OSError:
        return False


def _refused(driver) -> bool:
    """Raise with the page's message when the run failed (else the wait would last until its time-out)."""
    from selenium.webdriver.common.by import By

    message = driver.find_element(By.CSS_SELECTOR, "#message").text
    if message:
        raise RuntimeError(f"the run failed in the page: {message}")
    return False


WATCH = """
const marks = window.__rstitch_marks = {};
const clock = () => (document.querySelector('#clock-stitch .clock') || {}).outerHTML;
const before = clock();
const start = performance.now();
new MutationObserver(() => {
  if (clock() === before) return;  // this run has not drawn yet (its clock line differs from the last run's)
  const now = (performance.now() - start) / 1000;
  if (marks.first === undefined && document.querySelector('#stitched .tok')) marks.first = now;
  if (marks.done === undefined && document.querySelector('#clock-stitch .clock[data-state="done"]')) marks.done = now;
}).observe(document.body, {childList: true, subtree: true, characterData: true, attributes: true});
document.querySelector('#run').click();
"""


def one_run(driver) -> dict:
    """Press Run (in the page, with a MutationObserver installed first); seconds from the click to the first coloured
    token the page adds and to the clock saying done, on the browser's clock (a fast run may end before a poll from
    here would see it start)."""
    driver.execute_script(WATCH)
    marks = wait(lambda: (m := driver.execute_script("return window.__rstitch_marks")).get("done") is not None and m
                 or _refused(driver), 300)
    return {"first_token_s": marks["first"], "done_s": marks["done"]}


def repeat(driver, port: int, settle: float) -> dict:
    from selenium.webdriver.common.by import By

    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "hf_rstitch", "ui", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait(lambda: served(url), 600)
        http_s = time.perf_counter() - start
        driver.get(url)
        wait(lambda: [b for b in driver.find_elements(By.CSS_SELECTOR, "#prompt textarea") if b.is_enabled()], 120)
        page_s, page_cpu_s = time.perf_counter() - start, cpu_seconds(proc.pid)
        wait(lambda: [b for b in driver.find_elements(By.CSS_SELECTOR, "#run") if b.is_enabled()], 600)
        out = {"http_s": http_s, "page_s": page_s, "page_cpu_s": page_cpu_s, "ready_s": time.perf_counter() - start,
               "server_cpu_s": cpu_seconds(proc.pid, children=True)}
        time.sleep(settle)  # a reader typing a prompt
        out.update(one_run(driver))
        time.sleep(1.0)  # a reader reading the answer
        out.update({f"warm_{k}": v for k, v in one_run(driver).items()})
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def versions() -> dict:
    from importlib.metadata import version

    chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    return {"gradio": version("gradio"), "selenium": version("selenium"), "chromium": chromium}


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| repeat | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {i} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |" for i, r in enumerate(rows)]
    lines.append("| median | " + " | ".join(f"{statistics.median(r[k] for r in rows):.2f}" for k in keys) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=7870)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds between the page being usable and the first Run (0: at once)")
    parser.add_argument("--out", default=str(RESULTS / "ui_startup_cpu"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    driver = browser()
    try:
        rows = [repeat(driver, args.port, args.settle) for _ in range(args.repeats)]
    finally:
        driver.quit()
    md = table(rows)
    print(md)
    doc = {"device": device_name("cpu"), **environment(["cpu"]), **versions(), "settle_s": args.settle,
           "niceness": os.nice(0), "load_average_before": load_before,
           "load_average_after": os.getloadavg(), "targets": {"ready_s": 5.0, "first_token_s": 1.0},
           "repeats": rows, "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]}}
    head = (f"# `rstitch ui` startup and first tokens ({doc['device']})\n\n{doc['date']}, torch {doc['torch']}, "
            f"transformers {doc['transformers']}, gradio {doc['gradio']}, {doc['chromium']}; load average "
            f"{load_before[0]:.1f} before, {doc['load_average_after'][0]:.1f} after (the machine is shared); "
            f"niceness {doc['niceness']}.\n\n"
            "Seconds. From the process start: http_s (GET / answers), page_s (the page rendered, the prompt box "
            "takes typing), ready_s (Run enabled: the pair loaded and warmed up); page_cpu_s: CPU the page's "
            "process had used at page_s; server_cpu_s: it and its model worker at ready_s. "
            f"Run pressed {args.settle:g} s after that; from the click: first_token_s, done_s; warm_: a second run.\n\n")
    write_result(args.out, doc, head + md)


if __name__ == "__main__":
    main()
