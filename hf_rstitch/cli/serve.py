"""``rstitch serve``: an OpenAI-compatible HTTP endpoint over the continuous-batching engine."""

from __future__ import annotations

import argparse
import sys

from ..serve.config import ServeConfig, is_loopback
from .args import add_dataclass_args, dataclass_from_args

NAME = "serve"
HELP = "serve R-Stitch over HTTP: OpenAI-compatible /v1/chat/completions and /v1/completions"
DESCRIPTION = (
    "Loads an LLM and an SLM that share a tokenizer (default: the shipped toy-world pair) and serves them "
    "with FastAPI + uvicorn: GET /health, GET /v1/models, POST /v1/chat/completions and POST /v1/completions "
    "(OpenAI schema, stream=true as server-sent events, per-request `stitch_threshold`, usage with "
    "llm_tokens / slm_tokens / switches). Concurrent requests share one continuous batch of --max-batch rows. "
    "With a CUDA --device the engine runs in a process of its own and the HTTP side in --frontend-procs front-end "
    "processes (default 1; 0 on a CPU: everything in one process). --replicas N > 1 runs N copies behind Ray Serve. Needs fastapi and uvicorn: pip install fastapi uvicorn, or "
    "pip install '.[serve]' in a clone of hf-rstitch (it is on no package index)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, ServeConfig)


def _need(module: str, extra: str) -> bool:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        from ..extras import install_hint

        print(f"rstitch serve: error: needs the `{module}` package; install it with {install_hint(extra)}",
              file=sys.stderr)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    cfg = dataclass_from_args(ServeConfig, args)
    from .preflight import preflight

    preflight(sources={"--llm": cfg.llm, "--slm": cfg.slm, "--router": cfg.router})  # one line at once, not minutes
    if not all(_need(m, "serve") for m in ("fastapi", "uvicorn", "httptools")):
        return 2
    if not is_loopback(cfg.http.host):
        print(f"rstitch serve: listening on {cfg.http.host}: the server has no authentication; put it behind a proxy "
              "that has", file=sys.stderr)
    if cfg.replicas > 1 or cfg.ray_address:
        if not _need("ray", "serve-ray"):
            return 2
        from ..serve.replicas import run_replicas

        return run_replicas(cfg)
    if cfg.frontend_procs:
        from ..serve.frontends import run_split

        return run_split(cfg)  # the engine in a process of its own, the HTTP side in cfg.frontend_procs
    from ..serve.config import build_server
    from ..serve.driver import freeze_gc
    from ..serve.server import run as serve_app

    app = build_server(cfg)
    freeze_gc()  # the process serves and nothing else: its start-up objects out of the collector's walks
    serve_app(app, cfg.http.host, cfg.http.port)  # drains the engine before uvicorn closes connections
    return 0
