"""The page in a real browser: Debian's headless Chromium driven by selenium through the system chromedriver (no
browser download: explicit paths, SE_OFFLINE). Types a prompt, presses Run with the LLM alone beside, waits for
both to end, and checks what a reader sees: both colours, the stitched text equal to ``generate``'s decode for the
same settings, the plot drawn. Saves a screenshot (to $RSTITCH_UI_SCREENSHOT too when set: docs/img/ui.png is made
so). CI installs the browser (.ci/run: apt-get install chromium chromium-driver)."""

import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 240  # a loaded 2-core machine; a run takes a few seconds when the cores are free


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("selenium", reason="selenium is in the dev extra")
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
                    "apt-get install -y chromium chromium-driver (.ci/run does)")
    os.environ["SE_OFFLINE"] = "true"  # never let selenium-manager fetch a browser or a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,2000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


def _wait_for(driver, css: str, condition=None):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    condition = condition or ec.presence_of_element_located
    return WebDriverWait(driver, WAIT_S).until(condition((By.CSS_SELECTOR, css)))


def test_a_run_in_chromium_shows_both_colours_generates_text_and_the_plot(served, browser, tmp_path):
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    from hf_rstitch.toyworld.pair import load_test_split
    from hf_rstitch.ui.pair import load
    from hf_rstitch.ui.run import prompt_ids

    prompt = load_test_split()[0]["problem"]
    browser.get(served[0])
    box = _wait_for(browser, "#prompt textarea")
    box.clear()
    box.send_keys(prompt)
    browser.find_element(By.CSS_SELECTOR, "#compare input").click()
    run = _wait_for(browser, "#run", ec.element_to_be_clickable)  # "Loading models…" until the pair is ready
    assert run.text == "Run"
    run.click()
    _wait_for(browser, '#clock-stitch .clock[data-state="done"]')
    _wait_for(browser, '#clock-llm .clock[data-state="done"]')

    answer = browser.find_element(By.CSS_SELECTOR, "#stitched .answer")
    colours = {role: {t.value_of_css_property("color") for t in answer.find_elements(By.CSS_SELECTOR, f".tok-{role}")}
               for role in ("slm", "llm")}
    assert all(len(c) == 1 for c in colours.values()) and colours["slm"] != colours["llm"]

    pair = load()
    ids = prompt_ids(pair, prompt)
    out = pair.llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=pair.slm, do_sample=False,
                            stitch_threshold=pair.threshold, max_new_tokens=400)  # the page's defaults
    new = out[0, ids.shape[1]:].tolist()
    shown = browser.execute_script("return arguments[0].textContent", answer)
    assert shown == pair.tokenizer.decode(new, skip_special_tokens=True)

    plot = browser.find_element(By.CSS_SELECTOR, "#plot svg.entropy-plot")
    assert plot.size["width"] > 200 and plot.size["height"] > 50
    dots = plot.find_elements(By.CSS_SELECTOR, "circle")
    assert len(dots) >= len(new) and plot.find_elements(By.CSS_SELECTOR, "line.threshold")
    assert "the LLM alone" in browser.find_element(By.CSS_SELECTOR, "#clock-stitch").text

    shot = tmp_path / "ui.png"
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("RSTITCH_UI_SCREENSHOT"):
        shutil.copy(shot, os.environ["RSTITCH_UI_SCREENSHOT"])
