"""``HttpConfig``: the HTTP side of ``rstitch serve`` -- where it listens, what it accepts, how it answers.

One dataclass with help text and validation, torch-free and web-stack-free (``rstitch serve --help`` imports it).
``ServeConfig`` embeds it whole as its ``http`` field (:func:`hf_rstitch.configs.embeds`): the CLI flags keep
their names (``--header-timeout``, ``--max-body-bytes``, ...: :func:`hf_rstitch.cli.args.add_dataclass_args`),
and so does the Python API (``ServeConfig(header_timeout=5)``). The app reads it as one object
(``ServerSettings.http``, :mod:`.app`), a front-end process receives it inside its settings, and the connection
guard (:mod:`.guard`) takes it as its limits. It knows nothing of the model: what the LLM decides (context
window, vocabulary, sampling defaults, the default tau) is the rest of ``ServerSettings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..configs import help_meta
from .handover import STREAM_INTERVAL_S, STREAM_WRITES_PER_S

SHIPPED_NAME = "rstitch-toyworld-pair"  # the served name of the shipped pair


@dataclass
class HttpConfig:
    """The HTTP side's settings. Every field is the ``rstitch serve`` flag of its name (``header_timeout``:
    ``--header-timeout``), except those kept off the command line."""

    host: str = field(default="127.0.0.1", metadata=help_meta("address to listen on"))
    port: int = field(default=8000, metadata=help_meta("TCP port to listen on"))
    max_tokens: int = field(default=256, metadata=help_meta("completion budget of a request that sets no max_tokens"))
    model_name: str = field(default="", metadata=help_meta(
        "model id that /v1/models lists and responses carry (default: the LLM folder's name); several "
        "comma-separated names are aliases (the first is the one responses carry); requests naming any other "
        "model get 404"))
    max_body_bytes: int = field(default=4 * 2**20, metadata=help_meta(
        "largest request body in bytes; larger ones get 413 before they are read in full"))
    stream_interval: float = field(default=STREAM_INTERVAL_S, metadata=help_meta(
        "seconds an answer waits after a write before its next, which carries every token written meanwhile "
        "(the first token and the end go out at once); 0: a write per engine step"))
    stream_writes_per_s: float = field(default=STREAM_WRITES_PER_S, metadata=help_meta(
        "writes a second of all answers together at most: with many streams open each writes less often, "
        "several tokens a chunk, so that the HTTP side's Python leaves the engine its GIL; 0: no limit"))
    header_timeout: float = field(default=10.0, metadata=help_meta(
        "seconds a request's headers may take to arrive (from the connection, or the request's first byte); "
        "a connection that trickles them is closed"))
    body_timeout: float = field(default=60.0, metadata=help_meta(
        "seconds a request's body may take to arrive after its headers; a slower one is closed"))
    max_connections: int = field(default=4096, metadata=help_meta(
        "open HTTP connections at most; one more is answered 503 and closed before it is read"))
    drain_timeout: float = field(default=30.0, metadata=help_meta(
        "on SIGTERM, seconds that running requests get to finish before they are cancelled"))
    disconnect_poll: float = field(default=0.25, metadata=help_meta(
        "seconds between a non-streaming handler's checks that its client is still there", cli=False))
    error_ttl: float = field(default=300.0, metadata=help_meta(
        "seconds /health shows the last failed engine step's error", cli=False))

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_body_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_flag(name)} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        for name in ("stream_interval", "stream_writes_per_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{_flag(name)} must be >= 0 (0: off), got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "disconnect_poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{_flag(name)} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("drain_timeout", "error_ttl"):
            if getattr(self, name) < 0:
                raise ValueError(f"{_flag(name)} must be >= 0 seconds, got {getattr(self, name)}")

    def served_names(self, llm: str = "") -> tuple[str, ...]:
        """The served model's name, then its aliases: ``model_name``'s, else the name of the LLM's folder or Hub id
        ``llm`` (the shipped pair's name without one)."""
        names = tuple(n.strip() for n in self.model_name.split(",") if n.strip())
        return names or ((Path(llm).name if llm else SHIPPED_NAME),)


def _flag(name: str) -> str:
    """The flag of field ``name`` (``--header-timeout``); a field kept off the command line by its own name."""
    if HttpConfig.__dataclass_fields__[name].metadata.get("cli", True):
        return f"--{name.replace('_', '-')}"
    return f"HttpConfig.{name}"
