"""Several server replicas across GPUs and machines, on Ray Serve.

Each replica is one Ray actor that builds the same FastAPI app as ``rstitch serve`` (its own pair, engine and
driver thread) from the pickled :class:`~.config.ServeConfig`, and answers requests in-process
(:func:`.relay.call_app`). In front of them, Ray Serve's proxy listens on ``--host/--port`` and hands each request
to a front replica (:func:`.relay.front_app`, as many as engine replicas, no CPU reserved), which relays it
through Ray's deployment handle to the engine replicas -- spread by Ray, by their queue lengths -- and answers a
lost replica with a clean 503 OpenAI error (or an error event and ``[DONE]`` in a stream that has begun) instead
of the proxy's plain-text 500 or a cut stream. Ray places replicas by resources (with ``--device cuda``, one GPU a
replica by default: one replica per GPU, ``CUDA_VISIBLE_DEVICES`` set for each, so each replica's ``cuda`` is its
own GPU), across the machines of a Ray cluster (``--ray-address auto`` on a node of one), restarts replicas that
die, and drains a replica's running requests when it stops. Why Ray Serve rather than a load balancer in front
of N processes: docs/serving.md.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from typing import Any, Callable

from ray import serve

from .config import ServeConfig, build_server
from .relay import AtCapacity, call_app, front_app

APP_NAME = "rstitch"


class RStitchReplica:
    """One engine replica: the pair, its request engine and the OpenAI app around them, the app called in-process.
    With ``cfg.frontend_procs`` (``--frontend-procs 1``) and no ``build`` given, the engine runs in a child process of the
    replica (:class:`~.frontends.EngineProcess`, which inherits the replica's ``CUDA_VISIBLE_DEVICES``) and the
    replica's app -- schema, tokenizing, detokenizing, streaming -- talks to it as a front end does."""

    def __init__(self, cfg: ServeConfig, build: Callable[[ServeConfig], Any] | None = None):
        cfg = replica_config(cfg)
        self._engine = None
        if build is None and cfg.frontend_procs:
            from .frontends import split_app

            self._app, self._engine = split_app(cfg)
        else:
            self._app = (build or build_server)(cfg)
        self._drain_s = cfg.http.drain_timeout
        self._app.state.driver.start()  # what the app's lifespan does under uvicorn

    async def forward(self, head: dict[str, Any], body: bytes):
        async for item in call_app(self._app, head, body):
            yield item

    def check_health(self) -> None:
        """Ray Serve's periodic probe: a replica whose engine process died raises, and Ray replaces it."""
        if self._engine is not None and not self._engine.process.is_alive():
            raise RuntimeError(f"the replica's engine process exited (code {self._engine.process.exitcode})")

    def __del__(self):  # Ray Serve's graceful shutdown, once the replica's requests have ended or timed out
        driver = getattr(getattr(getattr(self, "_app", None), "state", None), "driver", None)
        if driver is not None:
            driver.drain(self._drain_s)
        if getattr(self, "_engine", None) is not None:
            self._engine.stop(0.0)  # its requests ended with the drain above


def replica_config(cfg: ServeConfig) -> ServeConfig:
    """An engine replica's own config: ``--stream-writes-per-s`` bounds the writes of all answers together, and
    every replica's answers pass through the same proxy (one a machine, a Python process) and front replicas, each
    write an item of a Ray stream at each hop -- so each replica gets its share of the budget, and the proxy carries
    as many writes as one server's uvicorn would (2 replicas at the default 500: 250 each; 64 streams on a replica
    then write every 0.256 s, several tokens a chunk). The first token and the end still go out at once."""
    if cfg.replicas > 1 and cfg.http.stream_writes_per_s > 0:
        share = cfg.http.stream_writes_per_s / cfg.replicas
        return dataclasses.replace(cfg, http=dataclasses.replace(cfg.http, stream_writes_per_s=share))
    return cfg


@serve.ingress()
class RStitchFront:
    """A front replica: relays each request to the engine replicas (``replica``: their deployment handle)."""

    def __init__(self, replica):
        self._app = front_app(forward_to(replica.options(stream=True)))

    def __serve_build_asgi_app__(self):
        return self._app


def forward_to(handle):
    """The front app's ``forward`` over Ray's streaming deployment ``handle``: a request Ray drops because every
    engine replica's queue is full (``BackPressureError``) is :class:`~.relay.AtCapacity` (a 429), not a lost
    replica."""
    from ray.serve.exceptions import BackPressureError

    async def forward(head: dict[str, Any], body: bytes):
        try:
            async for item in handle.forward.remote(head, body):
                yield item
        except BackPressureError as err:
            raise AtCapacity(str(err)) from err

    return forward


def deployment(cfg: ServeConfig):
    """The engine replicas' Ray Serve deployment for ``cfg`` (bind it with ``cfg`` and a builder)."""
    return serve.deployment(
        RStitchReplica, name="RStitchReplica", num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.replica_gpus},
        # a replica takes what its own engine holds (rows + queue); Ray queues up to max_queue more, then 503s
        max_ongoing_requests=cfg.engine.max_batch + cfg.max_queue, max_queued_requests=cfg.max_queue,
        graceful_shutdown_timeout_s=cfg.http.drain_timeout, graceful_shutdown_wait_loop_s=0.5,
    )


def application(cfg: ServeConfig, build: Callable[[ServeConfig], Any] | None = None):
    """Front replicas over engine replicas; ``build(cfg)`` makes a replica's app (default: ``build_server``)."""
    front = serve.deployment(
        RStitchFront, name="RStitchFront", num_replicas=cfg.replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=2 * cfg.replicas * (cfg.engine.max_batch + cfg.max_queue),
        graceful_shutdown_timeout_s=cfg.http.drain_timeout + 5, graceful_shutdown_wait_loop_s=0.5)
    return front.bind(deployment(cfg).bind(cfg, build))


def start(cfg: ServeConfig, ray_init: dict[str, Any] | None = None,
          build: Callable[[ServeConfig], Any] | None = None) -> None:
    """Connect to (or start) Ray, start Serve's HTTP proxy on ``cfg.http.host:cfg.http.port`` and deploy
    ``cfg.replicas`` replicas (``build``: see :func:`application`); returns once every replica is ready."""
    import ray

    init, local = dict(ray_init or {}), not ray.is_initialized() and not cfg.ray_address
    if not ray.is_initialized():
        if local and cfg.replica_gpus > 0 and "num_gpus" not in init:
            init["num_gpus"] = local_gpus()  # Ray's own look (NVML) can miss a container's GPUs
        ray.init(address=cfg.ray_address or None, include_dashboard=False, **init)
    problem = cfg.placement_problem(ray.cluster_resources()) if local else None  # a cluster may grow
    if problem:  # else serve.run would wait forever for replicas Ray cannot place
        ray.shutdown()
        raise RuntimeError(problem)
    serve.start(http_options={"host": cfg.http.host, "port": cfg.http.port})
    serve.run(application(cfg, build), name=APP_NAME, route_prefix="/")


def local_gpus() -> int:
    """CUDA devices this process sees (what a local Ray instance is told it has)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def stop() -> None:
    """Drain the replicas (each finishes its running requests, up to ``graceful_shutdown_timeout_s``),
    then stop Serve and leave Ray. Deleting the app first lets open streams finish through the
    proxy; ``serve.shutdown()`` alone stops the proxy under them."""
    import ray

    if not ray.is_initialized():  # start() failed before Serve ran, or stop() ran already
        return
    serve.delete(APP_NAME, _blocking=True)
    serve.shutdown()
    ray.shutdown()


def run_replicas(cfg: ServeConfig) -> int:
    """``rstitch serve --replicas N``: serve until SIGINT / SIGTERM, then drain."""
    done = threading.Event()
    start(cfg)
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, whose own SIGTERM handler aborts the process
        signal.signal(sig, lambda *_: done.set())
    print(f"rstitch serve: {cfg.replicas} replicas on Ray Serve at http://{cfg.http.host}:{cfg.http.port}", flush=True)
    while not done.wait(1.0):
        pass
    stop()
    return 0
