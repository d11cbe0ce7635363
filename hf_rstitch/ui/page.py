"""The Gradio page: :func:`app` builds it around a pair; ``rstitch ui`` and a Space's ``app.py`` launch it.

Layout, top to bottom: the prompt and Run; the controls (threshold, max new tokens, greedy / sampling, the router,
the LLM alone beside); the stitched answer coloured by model with its clock, and the LLM alone with its own; the
entropy plot; the summary table; the code that reproduces the run; the models (load another pair).

The page is served before the models load: the pairs load (torch and transformers with them) and warm up in the
background, while Run reads "Loading models…" and the controls that depend on the pair wait; each page asks for its
pair when it opens (:func:`_on_open`) and enables them once the pair is ready. Where they load: ``rstitch ui``
(:func:`serve`) loads and runs them in a worker process (:class:`~hf_rstitch.ui.worker.Worker`), so this process
only serves; :func:`app` (a notebook) in a thread of this one (:class:`~hf_rstitch.ui.pairs.Pairs`). Both answer the page's two
questions, the same way: :meth:`~hf_rstitch.ui.pairs.Pairs.ready` (a :class:`~hf_rstitch.ui.pair.PairInfo`) and :meth:`~hf_rstitch.ui.pairs.Pairs.frames`
(a run's :class:`~hf_rstitch.ui.frames.Frame` s, which :func:`~hf_rstitch.ui.frames.page_outputs` renders). Every handler
turns a refusal or a failure into a message in the page (:func:`~hf_rstitch.ui.render.message_html`); the server
logs the traceback of anything unexpected and keeps serving. Each browser tab holds its own pair key (a
``gr.State``); loaded pairs are shared through :class:`~hf_rstitch.ui.pairs.Pairs`, so two tabs on one pair load it once.
"""

from __future__ import annotations

import contextlib
import functools

from . import render
from .frames import failure, page_outputs
from .pair import BUDGET, DEFAULT_THRESHOLD, PairError, PairInfo, is_shipped, refs
from .pairs import Pairs
from .run import MAX_NEW_TOKENS, RunSettings
TITLE = "R-Stitch: see it stitch"
INTRO = ("The small model (SLM) writes while it is confident; where its normalized entropy rises above the threshold "
         "tau, the large model (LLM) takes over until it is confident again. Every token is coloured by the model "
         "that wrote it.")
LOADING = "Loading models…"


def default_prompt(shipped: bool) -> str:
    if shipped:
        from ..toyworld.pair import load_test_split

        return load_test_split()[0]["problem"]
    return "Tom has 12 apples and buys 7 more. How many apples does he have?"


def app(llm: str | None = None, slm: str | None = None, router: str | None = None):
    """The page as a ``gr.Blocks`` (``app().launch()``; in Colab / Jupyter it renders inline). The pair loads in the
    background from here on; the page can be served at once.

    Args:
        llm, slm: Hub ids, folders or ``shipped:llm`` / ``shipped:slm``; neither: the shipped pair (offline, CPU).
        router: an R-Stitch+ router (folder, Hub id or ``"shipped"``) where the pair's generation config names none.

    Raises:
        PairError: the references cannot name a pair (one given without the other, a folder that is missing or holds
            no model); ``rstitch ui`` prints it and exits. A pair that fails to load later says so in the page.
    """
    blocks, start_loading = build(llm, slm, router)
    start_loading()
    return blocks


def serve(llm: str | None = None, slm: str | None = None, router: str | None = None, **launch) -> None:
    """Serve the page (``blocks.launch(**launch)``) with its pairs in a worker process (``rstitch ui``): this process
    imports Gradio and serves on its own core while the worker imports torch and loads the pair on another. The
    worker starts before Gradio is imported. Returns when the server stops.

    Raises:
        PairError: as :func:`app`.
    """
    blocks, start_loading = build(llm, slm, router, worker=True)
    blocks.launch(prevent_thread_lock=True, **launch)
    start_loading()
    blocks.block_thread()


def build(llm: str | None, slm: str | None, router: str | None, worker: bool = False):
    """``(blocks, start_loading)``: the page, and a call that starts its pair's load (a page that opens first asks
    for the pair itself); ``worker``: the pairs load and run in a worker process (:mod:`.worker`)."""
    first = refs(llm, slm)  # before Gradio's import: a missing folder fails in a second
    early = None
    if worker:  # the worker imports torch and loads the pair on the other core while this process imports Gradio
        from .worker import Worker

        early = Worker({first: router})
        early.start(*first)
    from .gradio_import import app_at_launch, gradio

    gr = gradio(server=worker)
    deferred = app_at_launch() if worker else contextlib.nullcontext()  # serve() launches it at once
    with deferred, gr.Blocks(title=TITLE, analytics_enabled=False) as blocks:
        c = _layout(gr, *first)
        if worker:
            pairs = early
        else:
            pairs = Pairs(c["summary"], {first: router})
        key = gr.State(first)
        inputs = [key, *(c[name] for name in ("prompt", "threshold", "max_new_tokens", "mode", "seed", "router",
                                              "compare"))]
        outputs = [c[name] for name in ("message", "answer_slm", "clock_slm", "answer_llm", "clock_llm", "plot",
                                        "summary", "code")]
        gr.on([c["run"].click, c["prompt"].submit], functools.partial(_on_run, pairs), inputs=inputs,
              outputs=outputs, api_name="run", concurrency_limit=4, show_progress="hidden")
        ready = [c[name] for name in ("message", "threshold", "max_new_tokens", "router", "run", "models_status")]
        blocks.load(functools.partial(_on_open, pairs, c), inputs=[key], outputs=ready, api_name=False,
                    show_progress="hidden", concurrency_limit=None)
        c["load"].click(functools.partial(_on_load, pairs, c, key), inputs=[c["llm"], c["slm"]],
                        outputs=[key, c["models_status"], c["prompt"], *ready[:-1]], api_name="load_pair")
    return blocks, functools.partial(pairs.start, *first)


def _layout(gr, llm_ref: str, slm_ref: str) -> dict:
    """The components, by name; those that depend on the loaded pair wait for it (:func:`_ready`)."""
    c = {}
    gr.Markdown(f"## {TITLE}\n{INTRO}")
    gr.HTML(render.legend())
    with gr.Row():
        c["prompt"] = gr.Textbox(label="Prompt", value=default_prompt(is_shipped(llm_ref, slm_ref)), lines=3, scale=5, elem_id="prompt")
        c["run"] = gr.Button(LOADING, variant="primary", scale=1, elem_id="run", interactive=False)
    with gr.Row():
        c["threshold"] = gr.Slider(0, 1, value=DEFAULT_THRESHOLD, step=0.0005, label="threshold tau (normalized entropy)",
                                   elem_id="threshold", interactive=False)
        c["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS, value=BUDGET, step=1, label="max new tokens",
                                        interactive=False)
        c["mode"] = gr.Radio(["greedy", "sampling"], value="greedy", label="decoding")
        c["seed"] = gr.Number(0, precision=0, label="seed (sampling)")
    with gr.Row():
        c["router"] = gr.Checkbox(False, label="R-Stitch+ router", interactive=False, info=LOADING)
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
            c["llm"] = gr.Textbox(llm_ref, label="LLM (Hub id, folder or shipped:llm)")
            c["slm"] = gr.Textbox(slm_ref, label="SLM (same tokenizer)")
            c["load"] = gr.Button("Load pair")
        c["models_status"] = gr.HTML(f"{LOADING} LLM <code>{llm_ref}</code>, SLM <code>{slm_ref}</code>",
                                      elem_id="models-status")
    return c


def _ready(gr, c: dict, pair: PairInfo | None, error: str = "") -> dict:
    """The updates that make a page ready for ``pair`` (its defaults on the controls, Run enabled), or that say why
    it is not (``error``; Run stays off until a pair loads)."""
    if pair is None:
        return {c["message"]: render.message_html(error), c["run"]: gr.update(value="Run", interactive=False),
                c["router"]: gr.update(info="no pair loaded"), c["models_status"]: render.message_html(error)}
    return {c["message"]: "", c["threshold"]: gr.update(value=pair.threshold, interactive=True),
            c["max_new_tokens"]: gr.update(value=pair.budget, interactive=True),
            c["router"]: gr.update(value=False, interactive=pair.router is not None, info=pair.router_info),
            c["run"]: gr.update(value="Run", interactive=True), c["models_status"]: pair.line}


def _on_open(pairs: Pairs, c: dict, key):
    """When a page opens: wait for its pair, then enable the controls (or say why the pair did not load)."""
    import gradio as gr

    try:
        return _ready(gr, c, pairs.ready(*key))
    except PairError as err:
        return _ready(gr, c, None, f"{err}. Load another pair under Models.")


def _on_load(pairs: Pairs, c: dict, key_state, llm: str, slm: str):
    """Load another pair for this tab; a pair that cannot load leaves the tab's pair as it was."""
    import gradio as gr

    try:
        pair = pairs.ready(llm, slm)
    except PairError as err:
        return {c["models_status"]: render.message_html(str(err))}
    return {key_state: (pair.llm_ref, pair.slm_ref), c["prompt"]: gr.update(value=default_prompt(pair.shipped)),
            **_ready(gr, c, pair)}


def _on_run(pairs: Pairs, key, prompt, threshold, max_new_tokens, mode, seed, router, compare):
    """The run handler: yields the page's outputs (see :func:`app`) as the run streams."""
    try:
        settings = RunSettings(prompt, threshold, max_new_tokens, mode == "sampling", bool(router), seed)
        yield from page_outputs(pairs.frames(tuple(key), settings, bool(compare)), threshold)
    except Exception as err:  # noqa: BLE001  (the page shows one line; the server log has an unexpected traceback)
        yield _error(failure(err))


def _error(text: str):
    return (render.message_html(text), "", "", "", "", "", [], "")
