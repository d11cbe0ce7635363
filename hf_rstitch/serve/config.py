"""``ServeConfig``: what ``rstitch serve`` (and each Ray Serve replica) needs to build a server.

One dataclass, so the CLI flags, their help and their validation live in one place, and a replica
on another machine rebuilds exactly the server the command line described (the config is plain
data and pickles). It embeds two parts whole, each handed on as one object: ``engine``, an
:class:`~hf_rstitch.engine.EngineConfig` (to :func:`hf_rstitch.engine.build`), and ``http``, an
:class:`~.http_config.HttpConfig` (to the app's settings); their fields keep their flags and flat
names (``ServeConfig(max_batch=4, header_timeout=5)``). :func:`build_server` loads the pair, works
out the default tau once (:func:`served_threshold`) and returns the app; the web stack is imported
only there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..configs import embeds
from ..engine.config import EngineConfig, embeds_engine
from ..hf.settings import DEFAULT_THRESHOLD, default_threshold
from .http_config import HttpConfig

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@embeds("http", HttpConfig)
@embeds_engine()
@dataclass
class ServeConfig:
    llm: str = field(default="", metadata={"help": "LLM folder or Hub id (default: the shipped pair's LLM)"})
    slm: str = field(default="", metadata={"help": "SLM folder or Hub id (default: the shipped pair's SLM)"})
    threshold: float | None = field(default=None, metadata={
        "help": "R-Stitch entropy threshold tau in [0, 1] of a request that sets no `stitch_threshold`; default: the "
                f"LLM's generation_config.stitch_threshold (rstitch tune --write-config), else {DEFAULT_THRESHOLD}"})
    router: str = field(default="", metadata={
        "help": "R-Stitch+ router (folder or Hub id, e.g. hf_rstitch/assets/router) instead of the threshold: it "
                "routes every request with its own trained threshold, and requests may not set stitch_threshold"})
    device: str = field(default="cpu", metadata={"help": "torch device of both models (e.g. cpu, cuda, cuda:1)"})
    dtype: str = field(default="float32", metadata={"help": "model dtype",
                                                     "choices": ["float32", "bfloat16", "float16"]})
    engine: EngineConfig = field(default_factory=EngineConfig, metadata={"embed": True, "help":
        "the pair's engine: kind (--engine), --max-batch, --max-model-len, --kv-memory, --kv-tokens, --paged, "
        "--prefill-chunk, --join-wait, --join-group, --virtual-joins (hf_rstitch.engine.EngineConfig); "
        "ServeConfig(engine='fast', max_batch=4) takes them flat"})
    schedule: str = field(default="now", metadata={"help":
        "When the LLM runs for rows that need it in a batch: now (at once), or gather[:K[:M]]: such rows "
        "wait (no token) at most K steps (default 2) until M rows need it (default a quarter of the batch), while "
        "the SLM's rows go on: fewer LLM calls, the same outputs, full-attention models only. Measured slower on an "
        "H200 (7B/1.5B, B=4-64); see docs/howto/batching.md."})
    pin: str = field(default="none", metadata={
        "help": "serve every request with one model alone: llm (the LLM alone: the baseline stitched serving is "
                "measured against) or slm; none (the default): stitched", "choices": ["none", "llm", "slm"]})
    max_queue: int = field(default=64, metadata={
        "help": "requests that may wait for a free row; beyond max-batch + max-queue the server answers 429"})
    http: HttpConfig = field(default_factory=HttpConfig, metadata={"embed": True, "help":
        "the HTTP side: --host, --port, --max-tokens, --model-name, --max-body-bytes, --stream-interval, "
        "--stream-writes-per-s, --header-timeout, --body-timeout, --max-connections, --drain-timeout "
        "(hf_rstitch.serve.http_config.HttpConfig); ServeConfig(header_timeout=5) takes them flat"})
    frontend_procs: int | None = field(default=None, metadata={
        "help": "N >= 1: the engine runs in a process of its own (it only steps the batch) and the HTTP side (schema, "
                "tokenizing, detokenizing, streaming) in N front-end processes sharing the port; 0: both in one "
                "process. Default: 1 for one server on a CUDA --device (on an H200 the split kept 0.89-0.95 of the "
                "engine's own throughput where one process kept 0.68-0.97), else 0 (on a CPU the split costs a "
                "second Python to start and decodes no faster; replicas: not measured split). With --replicas: 1 "
                "puts each replica's engine in a child process, 0 keeps it in the replica's (docs/serving.md)"})
    replicas: int = field(default=1, metadata={
        "help": "server replicas; more than 1 runs them on Ray Serve (pip install fastapi uvicorn 'ray[serve]', or '.[serve-ray]' in a clone)"})
    ray_address: str = field(default="", metadata={
        "help": "Ray cluster to join for replicas (e.g. 'auto' on a cluster node; default: a local Ray instance)"})
    gpus_per_replica: float | None = field(default=None, metadata={
        "help": "GPUs Ray reserves for each replica (default: 1 with a CUDA --device, one replica on each GPU, which "
                "Ray makes that replica's cuda:0; else 0)"})
    cpus_per_replica: float = field(default=1.0, metadata={"help": "CPUs Ray reserves for each replica"})

    def __post_init__(self):
        from ..core.policies import check_threshold

        self.threshold = None if self.threshold is None else check_threshold(self.threshold, "--threshold")
        if bool(self.llm) != bool(self.slm):
            raise ValueError("pass both --llm and --slm, or neither (to serve the shipped pair)")
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.frontend_procs is None:  # the measured default: docs/serving.md, "Which layout by default"
            self.frontend_procs = 1 if self.device.startswith("cuda") and self.replicas == 1 and not self.ray_address else 0
        if self.frontend_procs < 0:
            raise ValueError(f"--frontend-procs must be >= 0 (0: one process), got {self.frontend_procs}")
        if self.frontend_procs > 1 and self.replicas > 1:
            raise ValueError(f"--frontend-procs runs one server's HTTP side in processes of its own; with --replicas "
                             f"Ray Serve's proxy and front replicas are the HTTP side: pass --frontend-procs 1 (each "
                             f"replica's engine in a process of its own) or 0, got {self.frontend_procs}")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        try:
            self.engine = self.engine.for_requests(self.schedule)  # a server's engine serves requests
        except ValueError as e:
            raise ValueError(f"--schedule: {e}") from None
        if self.pin not in ("none", "llm", "slm"):
            raise ValueError(f"--pin must be none (stitched), llm or slm, got {self.pin!r}")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 0:
            raise ValueError(f"--gpus-per-replica must be >= 0, got {self.gpus_per_replica}")
        if self.replicas > 1 and self.replica_gpus > 0 and self.device not in ("cuda", "cuda:0"):
            raise ValueError(f"--device {self.device} with --replicas {self.replicas}: Ray shows each replica only its "
                             "own GPUs, numbered from cuda:0; pass --device cuda")

    @property
    def replica_gpus(self) -> float:
        """GPUs Ray reserves for each replica: ``gpus_per_replica``, else one per replica on a CUDA device."""
        if self.gpus_per_replica is not None:
            return self.gpus_per_replica
        return 1.0 if self.device.startswith("cuda") else 0.0

    def placement_problem(self, resources: dict[str, float]) -> str | None:
        """Why Ray could never place ``replicas`` engine replicas on a local instance of ``resources`` (Ray's
        ``cluster_resources()``: ``GPU``, ``CPU`` totals), or None when it can (a cluster may grow: not asked there)."""
        for key, each, flag in (("GPU", self.replica_gpus, "--gpus-per-replica"),
                                ("CPU", self.cpus_per_replica, "--cpus-per-replica")):
            need, have = self.replicas * each, resources.get(key, 0.0)
            if need > have + 1e-9:
                return (f"--replicas {self.replicas} with {each:g} {key}(s) each need {need:g} {key}s; this Ray "
                        f"instance has {have:g}. Pass fewer --replicas, a smaller {flag}, or run on a Ray cluster "
                        "(--ray-address)")
        return None


def load_models(cfg: ServeConfig):
    """``(llm, slm, tokenizer)`` on ``cfg.device`` in eval mode (the shipped pair by default), through the one
    loader, which reports a model that cannot load in one line at once."""
    from ..hf.loading import load_pair
    from ..resources import resolve

    return load_pair(resolve(cfg.llm or "shipped:llm"), resolve(cfg.slm or "shipped:slm"), cfg.dtype, cfg.device)


def served_threshold(cfg: ServeConfig, llm) -> float:
    """The server's default tau (a request that sets no ``stitch_threshold``): ``--threshold``, else the LLM's tuned
    ``generation_config.stitch_threshold``, else the library's default. Worked out here alone, once a server
    (:func:`build_parts`), and handed to the engine and to the endpoints' settings alike."""
    return default_threshold(llm.generation_config, cfg.threshold)


def build_engine(cfg: ServeConfig, llm, slm, tau: float | None = None):
    """The request engine over the pair's engine, built once from ``cfg.engine`` (continuous batching,
    ``cfg.engine.max_batch`` rows, KV memory from ``cfg.engine.kv_memory``: :func:`hf_rstitch.engine.build`), whose
    requests default to ``tau`` (None: :func:`served_threshold`); with ``cfg.router``, every request routes with
    that R-Stitch+ router."""
    from ..engine import Pair, build
    from ..batching.requests import RequestEngine

    tau = served_threshold(cfg, llm) if tau is None else tau
    policy = None
    if cfg.router:
        from ..router.policy import policy_from_router

        policy = policy_from_router(cfg.router, slm, flag="--router")
    engine = build(Pair.of(llm, slm), cfg.engine)  # cfg.engine: ServeConfig's EngineConfig, for requests
    return RequestEngine(engine, threshold=tau, max_waiting=cfg.max_queue, policy=policy, schedule=cfg.schedule)


def settings_for(cfg: ServeConfig, llm, tau: float | None = None) -> Any:
    """The endpoints' settings: ``cfg.http`` whole, plus what the LLM decides -- the served names' default (its
    folder's name), its context window, vocabulary and sampling defaults -- and the default ``tau`` /health reports
    (None: :func:`served_threshold`; no tau under ``cfg.router``)."""
    from .app import ServerSettings

    gen, text = llm.generation_config, llm.config.get_text_config()
    names = cfg.http.served_names(cfg.llm)
    return ServerSettings(
        http=cfg.http, model_name=names[0], model_aliases=names[1:],
        max_context=getattr(text, "max_position_embeddings", None), vocab_size=int(text.vocab_size),
        do_sample=bool(gen.do_sample), temperature=float(gen.temperature if gen.temperature is not None else 1.0),
        top_p=float(gen.top_p if gen.top_p is not None else 1.0),
        threshold=None if cfg.router else (served_threshold(cfg, llm) if tau is None else tau),
        router=cfg.router or None, pin=None if cfg.pin == "none" else cfg.pin)


def build_parts(cfg: ServeConfig, llm, slm) -> tuple[Any, Any]:
    """``(request engine, endpoints' settings)`` of a loaded pair, the server's default tau worked out once
    (:func:`served_threshold`) and handed to both: what one process and a split server's engine process build."""
    tau = served_threshold(cfg, llm)
    return build_engine(cfg, llm, slm, tau), settings_for(cfg, llm, tau)


def build_server(cfg: ServeConfig):
    """Load the pair and return the FastAPI app serving it: the request engine over the pair's engine and the
    endpoints' settings (``cfg.http`` and what the LLM decides), built once (:func:`build_parts`)."""
    import hf_rstitch  # noqa: F401  (registers stitched generate)

    from .app import create_app

    llm, slm, tok = load_models(cfg)
    engine, settings = build_parts(cfg, llm, slm)
    return create_app(engine, tok, settings)


def is_loopback(host: str) -> bool:
    return host in _LOOPBACK
