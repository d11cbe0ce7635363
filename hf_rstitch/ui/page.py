"""The Gradio page: :func:`app` builds it around a pair; ``rstitch ui`` and a Space's ``app.py`` launch it.

Layout, top to bottom: the prompt and Run; the controls (threshold, max new tokens, greedy / sampling, the router,
the LLM alone beside); the stitched answer coloured by model with its clock, and the LLM alone with its own; the
entropy plot; the summary table; the code that reproduces the run; the models (load another pair).

Every handler turns a refusal or a failure into a message in the page (:func:`~hf_rstitch.ui.render.message_html`);
the server logs the traceback of anything unexpected and keeps serving. Each browser tab holds its own pair key
(a ``gr.State``); loaded pairs are shared through :class:`Pairs`, so two tabs on one pair load it once.
"""

from __future__ import annotations

import functools
import logging
import threading

from . import render
from .code import reproduce
from .pair import Pair, PairError, load
from .run import MAX_NEW_TOKENS, RunError, RunSettings, stream

log = logging.getLogger("hf_rstitch.ui")
TITLE = "R-Stitch: see it stitch"
INTRO = ("The small model (SLM) writes while it is confident; where its normalized entropy rises above the threshold "
         "tau, the large model (LLM) takes over until it is confident again. Every token is coloured by the model "
         "that wrote it.")


class Pairs:
    """Loaded pairs by ``(llm, slm)`` reference, loaded once each (a lock per load: two tabs asking for one pair
    wait for the same load)."""

    def __init__(self, first: Pair):
        self.loaded = {(first.llm_ref, first.slm_ref): first}
        self.lock = threading.Lock()
        self.warm = threading.Lock()  # held by the one warm-up (:func:`_warm_up`)
        self.warmed = False

    def get(self, llm: str, slm: str) -> Pair:
        key = (llm.strip(), slm.strip())
        with self.lock:
            if key not in self.loaded:
                self.loaded[key] = load(*key)
            return self.loaded[key]


def default_prompt(pair: Pair) -> str:
    if pair.shipped:
        from ..toyworld.pair import load_test_split

        return load_test_split()[0]["problem"]
    return "Tom has 12 apples and buys 7 more. How many apples does he have?"


def app(llm: str | None = None, slm: str | None = None, router: str | None = None):
    """The page as a ``gr.Blocks`` (``app().launch()``; in Colab / Jupyter it renders inline).

    Args:
        llm, slm: Hub ids, folders or ``shipped:llm`` / ``shipped:slm``; neither: the shipped pair (offline, CPU).
        router: an R-Stitch+ router (folder, Hub id or ``"shipped"``) where the pair's generation config names none.

    Raises:
        PairError: the pair cannot load (the message says why); ``rstitch ui`` prints it and exits.
    """
    first = load(llm, slm, router)  # before Gradio's import: a pair that cannot load fails in a second
    import gradio as gr

    pairs = Pairs(first)
    with gr.Blocks(title=TITLE, analytics_enabled=False) as blocks:
        c = _layout(gr, first)
        key = gr.State((first.llm_ref, first.slm_ref))
        inputs = [key, *(c[name] for name in ("prompt", "threshold", "max_new_tokens", "mode", "seed", "router",
                                              "compare"))]
        outputs = [c[name] for name in ("message", "answer_slm", "clock_slm", "answer_llm", "clock_llm", "plot",
                                        "summary", "code")]
        gr.on([c["run"].click, c["prompt"].submit], functools.partial(_on_run, pairs), inputs=inputs,
              outputs=outputs, api_name="run", concurrency_limit=4, show_progress="hidden")
        blocks.load(functools.partial(_warm_up, pairs, first, c["summary"]), api_name=False, show_progress="hidden")
        c["load"].click(functools.partial(_on_load, pairs), inputs=[c["llm"], c["slm"]],
                        outputs=[key, c["models_status"], c["threshold"], c["router"], c["prompt"]],
                        api_name="load_pair")
    return blocks


def _layout(gr, pair: Pair) -> dict:
    """The components, by name."""
    c = {}
    gr.Markdown(f"## {TITLE}\n{INTRO}")
    gr.HTML(render.legend())
    with gr.Row():
        c["prompt"] = gr.Textbox(label="Prompt", value=default_prompt(pair), lines=3, scale=5, elem_id="prompt")
        c["run"] = gr.Button("Run", variant="primary", scale=1, elem_id="run")
    with gr.Row():
        c["threshold"] = gr.Slider(0, 1, value=pair.threshold, step=0.0005, label="threshold tau (normalized entropy)",
                                   elem_id="threshold")
        c["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS, value=_budget(pair), step=1, label="max new tokens")
        c["mode"] = gr.Radio(["greedy", "sampling"], value="greedy", label="decoding")
        c["seed"] = gr.Number(0, precision=0, label="seed (sampling)")
    with gr.Row():
        c["router"] = gr.Checkbox(False, label="R-Stitch+ router", interactive=pair.router is not None,
                                  info=_router_info(pair))
        c["compare"] = gr.Checkbox(False, label="also run the LLM alone (after the stitched run, for the speed-up)",
                                   elem_id="compare")
    c["message"] = gr.HTML("", elem_id="message")
    with gr.Row():
        with gr.Column():
            gr.Markdown("**R-Stitch** (SLM + LLM)")
            c["clock_slm"] = gr.HTML("", elem_id="clock-stitch")
            c["answer_slm"] = gr.HTML("", elem_id="stitched")
        with gr.Column():
            gr.Markdown("**LLM alone**")
            c["clock_llm"] = gr.HTML("", elem_id="clock-llm")
            c["answer_llm"] = gr.HTML("", elem_id="llm-alone")
    c["plot"] = gr.HTML("", elem_id="plot")
    c["summary"] = gr.Dataframe(headers=["out.stitch.summary()", "value"], label="summary", interactive=False,
                                elem_id="summary")
    c["code"] = gr.Code(language="python", label="reproduce this run", interactive=False, elem_id="code")
    with gr.Accordion("Models", open=False):
        with gr.Row():
            c["llm"] = gr.Textbox(pair.llm_ref, label="LLM (Hub id, folder or shipped:llm)")
            c["slm"] = gr.Textbox(pair.slm_ref, label="SLM (same tokenizer)")
            c["load"] = gr.Button("Load pair")
        c["models_status"] = gr.HTML(_pair_line(pair), elem_id="models-status")
    return c


def _budget(pair: Pair) -> int:
    return min(int(getattr(pair.llm.generation_config, "max_new_tokens", None) or 256), MAX_NEW_TOKENS)


def _router_info(pair: Pair) -> str:
    return f"router: {pair.router}" if pair.router else "this pair has no router"


def _pair_line(pair: Pair) -> str:
    params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.llm, pair.slm)]
    return (f"LLM <code>{pair.llm_ref}</code> ({params[0]:.1f}M), SLM <code>{pair.slm_ref}</code> ({params[1]:.1f}M) "
            f"on {pair.device}; default tau {pair.threshold:g}; {_router_info(pair)}")


def _warm_up(pairs: Pairs, pair: Pair, table) -> None:
    """When the first page opens: a 4-token run through the page's own path and the table's conversion, so the first
    run the user starts imports nothing (on a busy 2-core machine the first run's first token came 5 s later than
    the second's without it). The page is usable meanwhile."""
    with pairs.warm:
        if pairs.warmed:
            return
        pairs.warmed = True
        try:
            for outputs in _stream_page(pair, RunSettings("1 + 1 =", pair.threshold, 4).checked(), compare=False):
                table.postprocess(outputs[6])
        except Exception:  # noqa: BLE001  (a warm-up that fails costs the first run its imports, nothing else)
            log.exception("rstitch ui: warm-up failed")


def _on_load(pairs: Pairs, llm: str, slm: str):
    """Load another pair for this tab; a pair that cannot load leaves the tab's pair as it was."""
    import gradio as gr

    try:
        pair = pairs.get(llm, slm)
    except PairError as err:
        return gr.update(), render.message_html(str(err)), gr.update(), gr.update(), gr.update()
    return ((pair.llm_ref, pair.slm_ref), _pair_line(pair), gr.update(value=pair.threshold),
            gr.update(value=False, interactive=pair.router is not None, info=_router_info(pair)),
            gr.update(value=default_prompt(pair)))


def _on_run(pairs: Pairs, key, prompt, threshold, max_new_tokens, mode, seed, router, compare):
    """The run handler: yields the page's outputs (see :func:`app`) as the run streams."""
    try:
        pair = pairs.get(*key)
        settings = RunSettings(prompt, threshold, max_new_tokens, mode == "sampling", bool(router), seed).checked()
        yield from _stream_page(pair, settings, bool(compare))
    except (RunError, PairError) as err:
        yield _error(str(err))
    except Exception as err:  # noqa: BLE001  (the page shows one line; the server log has the traceback)
        log.exception("rstitch ui: run failed")
        from ..sources import one_line

        yield _error(f"unexpected error ({type(err).__name__}): {one_line(err)}")


def _error(text: str):
    return (render.message_html(text), "", "", "", "", "", [], "")


def _stream_page(pair: Pair, settings: RunSettings, compare: bool):
    code = reproduce(pair, settings)
    plot = ""
    stitched = None
    for snap in stream(pair, settings):
        stitched = snap
        plot = render.entropy_svg(snap.slm_entropy, snap.llm_entropy, settings.threshold)
        yield ("", render.tokens_html(pair.tokenizer, snap.ids, snap.roles, "stitched"),
               render.clock_line(snap.seconds, len(snap.ids), snap.done), "", "", plot,
               render.summary_rows(snap.summary), code)
    if not compare:
        return
    left = render.tokens_html(pair.tokenizer, stitched.ids, stitched.roles, "stitched")
    for snap in stream(pair, settings, stitched=False):
        speedup = snap.seconds / stitched.seconds if snap.done and stitched.seconds > 0 else None
        yield ("", left, render.clock_line(stitched.seconds, len(stitched.ids), True, speedup),
               render.tokens_html(pair.tokenizer, snap.ids, snap.roles, "llm"),
               render.clock_line(snap.seconds, len(snap.ids), snap.done), plot,
               render.summary_rows(stitched.summary), code)
