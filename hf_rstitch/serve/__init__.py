"""Serving: R-Stitch behind an OpenAI-compatible HTTP API (``rstitch serve``).

* :mod:`.driver` -- the background thread that drives the request engine's ``step()``;
* :mod:`.protocol` / :mod:`.responses` -- OpenAI request and response bodies;
* :mod:`.streams` -- a request's events as one JSON answer or server-sent events;
* :mod:`.errors` -- every error in OpenAI's shape, the body size limit, the published schema's answers;
* :mod:`.app` -- the FastAPI app (``create_app``);
* :mod:`.server` -- uvicorn that drains the engine before it closes connections (what the CLI runs);
* :mod:`.config` -- ``ServeConfig`` and ``build_server`` (what the CLI and each replica run);
* :mod:`.http_config` -- ``HttpConfig``, the HTTP side's flags as one object (``ServeConfig.http``, the app's
  ``settings.http``, the connection guard's limits);
* :mod:`.split` / :mod:`.frontends` -- the engine in a process of its own and the HTTP side in front-end processes
  (the default on a CUDA device);
* :mod:`.replicas` -- several replicas across GPUs and machines on Ray Serve.

Importing this package loads neither FastAPI nor torch; the web stack is the optional extra
``pip install fastapi uvicorn`` (or ``pip install '.[serve]'`` in a clone).
"""

from .config import ServeConfig
from .driver import EngineDriver, ShuttingDown

__all__ = ["EngineDriver", "QueueFull", "ServeConfig", "ShuttingDown"]


def __getattr__(name: str):
    if name == "QueueFull":  # the engine's one admission limit (loads torch: not at import)
        from ..batching.request_types import QueueFull

        return QueueFull
    raise AttributeError(name)
