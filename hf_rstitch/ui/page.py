"""The Gradio page: :func:`app` builds it around a pair; ``rstitch ui`` and a Space's ``app.py`` launch it.

Layout, top to bottom: the prompt and Run; the controls (threshold, max new tokens, greedy / sampling, the router,
the LLM alone beside); the stitched answer coloured by model with its clock, and the LLM alone with its own; the
entropy plot; the summary table; the code that reproduces the run; the models (load another pair).

The page is served before the models load: :class:`Pairs` loads a pair (torch and transformers with it) and warms it
up in a background thread, while Run reads "Loading models…" and the controls that depend on the pair wait; each
page asks for its pair when it opens (:func:`_on_open`) and enables them once the pair is ready. Every handler
turns a refusal or a failure into a message in the page (:func:`~hf_rstitch.ui.render.message_html`); the server
logs the traceback of anything unexpected and keeps serving. Each browser tab holds its own pair key (a
``gr.State``); loaded pairs are shared through :class:`Pairs`, so two tabs on one pair load it once.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading

from . import render
from .code import reproduce
from .pair import DEFAULT_THRESHOLD, Pair, PairError, is_shipped, load, refs
from .run import MAX_NEW_TOKENS, RunError, RunSettings, stream

log = logging.getLogger("hf_rstitch.ui")
TITLE = "R-Stitch: see it stitch"
INTRO = ("The small model (SLM) writes while it is confident; where its normalized entropy rises above the threshold "
         "tau, the large model (LLM) takes over until it is confident again. Every token is coloured by the model "
         "that wrote it.")
LOADING = "Loading models…"
BUDGET = 256  # max new tokens where the LLM's generation config names none


class Pairs:
    """Pairs by ``(llm, slm)`` reference, each loaded and warmed up once, one at a time, in a background thread
    (:meth:`start`); :meth:`get` waits for one. A load that failed is forgotten, so asking again retries it."""

    def __init__(self, table=None, routers: dict | None = None):
        self.table = table  # the summary component: the warm-up converts a table as the page will
        self.routers = dict(routers or {})  # (llm, slm) -> the router given for that pair (the first pair's)
        self.lock = threading.Lock()
        self.loads: dict[tuple[str, str], concurrent.futures.Future] = {}
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rstitch-ui-load")

    def start(self, llm: str | None, slm: str | None, router: str | None = None) -> concurrent.futures.Future:
        """The pair's load (begun now unless begun before).

        Raises:
            PairError: the references cannot name a pair (:func:`~hf_rstitch.ui.pair.refs`).
        """
        key = refs((llm or "").strip() or None, (slm or "").strip() or None)
        with self.lock:
            if key not in self.loads:
                self.loads[key] = self.worker.submit(self._load, key, router or self.routers.get(key))
            return self.loads[key]

    def get(self, llm: str | None, slm: str | None) -> Pair:
        """The pair, once loaded and warmed up (waits for it).

        Raises:
            PairError: the pair cannot load (the message says why).
        """
        future = self.start(llm, slm)
        try:
            return future.result()
        except PairError:
            with self.lock:
                for key in [k for k, f in self.loads.items() if f is future]:
                    del self.loads[key]
            raise

    def _load(self, key: tuple[str, str], router: str | None) -> Pair:
        try:
            pair = load(*key, router)
        except PairError as err:
            log.error("rstitch ui: %s", err)
            raise
        _warm_up(pair, self.table)
        return pair


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
    """Serve the page (``blocks.launch(**launch)``) and only then load the pair: on a small machine torch's import
    and the load would otherwise slow the server's start (``rstitch ui``). Returns when the server stops.

    Raises:
        PairError: as :func:`app`.
    """
    blocks, start_loading = build(llm, slm, router)
    blocks.launch(prevent_thread_lock=True, **launch)
    start_loading()
    blocks.block_thread()


def build(llm: str | None, slm: str | None, router: str | None):
    """``(blocks, start_loading)``: the page, and a call that starts its pair's load (a page that opens first asks
    for the pair itself)."""
    first = refs(llm, slm)  # before Gradio's import: a missing folder fails in a second
    from .gradio_import import gradio

    gr = gradio()
    with gr.Blocks(title=TITLE, analytics_enabled=False) as blocks:
        c = _layout(gr, *first)
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


def _budget(pair: Pair) -> int:
    return min(int(getattr(pair.llm.generation_config, "max_new_tokens", None) or BUDGET), MAX_NEW_TOKENS)


def _router_info(pair: Pair) -> str:
    return f"router: {pair.router}" if pair.router else "this pair has no router"


def _pair_line(pair: Pair) -> str:
    params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.llm, pair.slm)]
    return (f"LLM <code>{pair.llm_ref}</code> ({params[0]:.1f}M), SLM <code>{pair.slm_ref}</code> ({params[1]:.1f}M) "
            f"on {pair.device}; default tau {pair.threshold:g}; {_router_info(pair)}")


def _warm_up(pair: Pair, table) -> None:
    """A 4-token run through the page's own path and the table's conversion, so the first run the user starts
    imports nothing and sets nothing up (on a busy 2-core machine the first run's first token came 5 s later than
    the second's without it)."""
    try:
        for outputs in _stream_page(pair, RunSettings("1 + 1 =", pair.threshold, 4).checked(), compare=False):
            if table is not None:
                table.postprocess(outputs[6])
    except Exception:  # noqa: BLE001  (a warm-up that fails costs the first run its imports, nothing else)
        log.exception("rstitch ui: warm-up failed")


def _ready(gr, c: dict, pair: Pair | None, error: str = "") -> dict:
    """The updates that make a page ready for ``pair`` (its defaults on the controls, Run enabled), or that say why
    it is not (``error``; Run stays off until a pair loads)."""
    if pair is None:
        return {c["message"]: render.message_html(error), c["run"]: gr.update(value="Run", interactive=False),
                c["router"]: gr.update(info="no pair loaded"), c["models_status"]: render.message_html(error)}
    return {c["message"]: "", c["threshold"]: gr.update(value=pair.threshold, interactive=True),
            c["max_new_tokens"]: gr.update(value=_budget(pair), interactive=True),
            c["router"]: gr.update(value=False, interactive=pair.router is not None, info=_router_info(pair)),
            c["run"]: gr.update(value="Run", interactive=True), c["models_status"]: _pair_line(pair)}


def _on_open(pairs: Pairs, c: dict, key):
    """When a page opens: wait for its pair, then enable the controls (or say why the pair did not load)."""
    import gradio as gr

    try:
        return _ready(gr, c, pairs.get(*key))
    except PairError as err:
        return _ready(gr, c, None, f"{err}. Load another pair under Models.")


def _on_load(pairs: Pairs, c: dict, key_state, llm: str, slm: str):
    """Load another pair for this tab; a pair that cannot load leaves the tab's pair as it was."""
    import gradio as gr

    try:
        pair = pairs.get(llm, slm)
    except PairError as err:
        return {c["models_status"]: render.message_html(str(err))}
    return {key_state: (pair.llm_ref, pair.slm_ref), c["prompt"]: gr.update(value=default_prompt(pair.shipped)),
            **_ready(gr, c, pair)}


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
