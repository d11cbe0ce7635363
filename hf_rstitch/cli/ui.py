"""``rstitch ui``: the Gradio page (:mod:`hf_rstitch.ui`) for a pair, on this machine."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from .args import add_dataclass_args, dataclass_from_args

NAME = "ui"
HELP = "open a web page that runs a pair and colours every token by the model that wrote it (needs Gradio)"
DESCRIPTION = (
    "Starts a Gradio page (default: the shipped toy-world pair, offline, on CPU): type a prompt, press Run and "
    "watch the stitched answer stream with SLM and LLM tokens in two colours, the entropy of each token against the "
    "threshold, the summary of out.stitch and the generate() call that reproduces the run; optionally the LLM alone "
    "beside it with both clocks and the speed-up."
)


@dataclass
class UiConfig:
    llm: str = field(default="", metadata={"help": "LLM: Hub id, folder or shipped:llm (default: the shipped pair)"})
    slm: str = field(default="", metadata={"help": "SLM sharing the LLM's tokenizer (default: the shipped pair)"})
    router: str = field(default="", metadata={
        "help": "R-Stitch+ router (folder, Hub id or shipped) when the LLM's generation config names none; the "
                "shipped pair has the shipped router"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0: every interface)"})
    port: int = field(default=7860, metadata={"help": "port (0: a free one)"})
    share: bool = field(default=False, metadata={"help": "also ask Gradio for a public *.gradio.live link (network)"})

    def __post_init__(self):
        if bool(self.llm) != bool(self.slm):
            raise ValueError("pass both --llm and --slm, or neither (to use the shipped pair)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be 0 to 65535, got {self.port}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, UiConfig)


def free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> int:
    cfg = dataclass_from_args(UiConfig, args)
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline by default: no usage report, no version check
    from ..ui import serve
    from ..ui.pair import PairError

    try:
        serve(cfg.llm or None, cfg.slm or None, cfg.router or None, server_name=cfg.host,
              server_port=cfg.port or free_port(cfg.host), share=cfg.share, show_error=True, quiet=False)
    except PairError as err:
        print(f"rstitch ui: error: {err}", file=sys.stderr)
        return 2
    return 0
