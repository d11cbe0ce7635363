"""Several server replicas across GPUs and machines, on Ray Serve.

Each replica is one Ray actor that builds the same FastAPI app as ``rstitch serve`` (its own pair,
engine and driver thread) from the pickled :class:`~.config.ServeConfig`; Ray Serve's proxy listens
on ``--host/--port`` and spreads requests over the replicas. Ray places replicas by resources
(with ``--device cuda``, one GPU a replica by default: one replica per GPU, ``CUDA_VISIBLE_DEVICES`` set for
each, so each replica's ``cuda`` is its own GPU), across the
machines of a Ray cluster (``--ray-address auto`` on a node of one), restarts replicas that die,
and drains a replica's running requests when it stops. The app's lifespan (driver start, drain)
runs inside each replica. Why Ray Serve rather than a load balancer in front of N processes:
docs/serving.md.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ray import serve

from .config import ServeConfig, build_server

APP_NAME = "rstitch"


@serve.ingress()
class RStitchReplica:
    """One replica: the pair, its request engine and the OpenAI app around them."""

    def __init__(self, cfg: ServeConfig):
        self._app = build_server(cfg)

    def __serve_build_asgi_app__(self):
        return self._app


def deployment(cfg: ServeConfig):
    """The Ray Serve deployment for ``cfg`` (bind it and ``serve.run`` it)."""
    return serve.deployment(
        RStitchReplica, name="RStitchReplica", num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.replica_gpus},
        # a replica takes what its own engine holds (rows + queue); Ray queues up to max_queue more, then 503s
        max_ongoing_requests=cfg.max_batch + cfg.max_queue, max_queued_requests=cfg.max_queue,
        graceful_shutdown_timeout_s=cfg.drain_timeout, graceful_shutdown_wait_loop_s=0.5,
    )


def start(cfg: ServeConfig, ray_init: dict[str, Any] | None = None) -> None:
    """Connect to (or start) Ray, start Serve's HTTP proxy on ``cfg.host:cfg.port`` and deploy
    ``cfg.replicas`` replicas; returns once every replica is ready."""
    import ray

    if not ray.is_initialized():
        ray.init(address=cfg.ray_address or None, include_dashboard=False, **(ray_init or {}))
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(deployment(cfg).bind(cfg), name=APP_NAME, route_prefix="/")


def stop() -> None:
    """Drain the replicas (each finishes its running requests, up to ``graceful_shutdown_timeout_s``),
    then stop Serve and leave Ray. Deleting the app first lets open streams finish through the
    proxy; ``serve.shutdown()`` alone stops the proxy under them."""
    import ray

    serve.delete(APP_NAME, _blocking=True)
    serve.shutdown()
    ray.shutdown()


def run_replicas(cfg: ServeConfig) -> int:
    """``rstitch serve --replicas N``: serve until SIGINT / SIGTERM, then drain."""
    done = threading.Event()
    start(cfg)
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, whose own SIGTERM handler aborts the process
        signal.signal(sig, lambda *_: done.set())
    print(f"rstitch serve: {cfg.replicas} replicas on Ray Serve at http://{cfg.host}:{cfg.port}", flush=True)
    while not done.wait(1.0):
        pass
    stop()
    return 0
