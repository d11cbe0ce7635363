"""``rstitch generate``: one stitched completion of a prompt, tokens coloured by model."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..hf.settings import DEFAULT_THRESHOLD
from ..toyworld.tasks import example_row
from .args import add_dataclass_args, dataclass_from_args

NAME = "generate"
HELP = "generate one completion with R-Stitch for a prompt and show which model wrote each token"
DESCRIPTION = (
    "Loads an LLM and an SLM that share a tokenizer (local folders or Hub ids; default: the shipped "
    "toy-world pair), applies the chat template to --prompt (default: a held-out problem of the toy world, the "
    "shipped pair's own kind of question) and decodes with R-Stitch at --threshold. "
    "Prints the completion with SLM and LLM tokens in different colours and the stitch summary."
)


@dataclass
class GenerateConfig:
    prompt: str = field(default_factory=lambda: example_row()["problem"], metadata={"help": "the user message"})
    llm: str = field(default="", metadata={"help": "LLM folder, Hub id or shipped:llm (default: the shipped pair's LLM)"})
    slm: str = field(default="", metadata={"help": "SLM folder, Hub id or shipped:slm (default: the shipped pair's SLM)"})
    threshold: float | None = field(default=None, metadata={
        "help": "R-Stitch entropy threshold tau in [0, 1]; default: the LLM's generation_config.stitch_threshold "
                f"(rstitch tune --write-config), else {DEFAULT_THRESHOLD}"})
    max_new_tokens: int = field(default=400, metadata={"help": "decoding budget"})
    device: str = field(default="cpu", metadata={"help": "torch device"})
    dtype: str = field(default="float32", metadata={"help": "model dtype", "choices": ["float32", "bfloat16", "float16"]})
    sample: bool = field(default=False, metadata={"help": "sample (temperature 0.6, top-p 0.95) instead of greedy"})
    colour: bool | None = field(default=None, metadata={
        "help": "colour tokens by model (ANSI); default: only on a terminal and without NO_COLOR"})
    engine: str | None = field(default=None, metadata={
        "help": "auto (the default, or $HF_RSTITCH_ENGINE): the fast engine where it runs the pair (CUDA; its first "
                "call in a process compiles and captures graphs, 11-26 s for a 7B pair), else default: the eager "
                "engine, faster for one short generation; fast: insist on the fast engine",
        "choices": ["default", "fast", "auto"]})

    def __post_init__(self):
        from ..core.policies import check_threshold

        from ..resources import resolve

        if self.threshold is not None:
            self.threshold = check_threshold(self.threshold, "--threshold")
        self.llm, self.slm = resolve(self.llm), resolve(self.slm)  # shipped:llm -> its folder
        if bool(self.llm) != bool(self.slm):
            raise ValueError("pass both --llm and --slm, or neither (to use the shipped pair)")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        from ..sources import check_device, check_local_source

        for flag, source in (("--llm", self.llm), ("--slm", self.slm)):
            if source:
                check_local_source(source, flag)
        check_device(self.device)
        from ..decode.engines import engine_option

        self.engine = engine_option(self.engine)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, GenerateConfig)


def _load(cfg: GenerateConfig):
    from ..hf.loading import load_pair
    from ..resources import resolve

    return load_pair(cfg.llm or resolve("shipped:llm"), cfg.slm or resolve("shipped:slm"), cfg.dtype, cfg.device)


def run(args: argparse.Namespace) -> int:
    cfg = dataclass_from_args(GenerateConfig, args)
    import hf_rstitch  # noqa: F401

    from ..eval.data import prompt_ids
    from ..hf.settings import default_threshold
    from .demo import coloured, wants_colour

    import torch

    llm, slm, tok = _load(cfg)
    ids = torch.tensor([prompt_ids(tok, cfg.prompt, instruction="")], device=cfg.device)
    sampling = dict(do_sample=True, temperature=0.6, top_p=0.95) if cfg.sample else dict(do_sample=False)
    tau = default_threshold(llm.generation_config, cfg.threshold)
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_threshold=tau,
                       max_new_tokens=cfg.max_new_tokens, return_dict_in_generate=True, stitch_engine=cfg.engine,
                       **sampling)
    print(coloured(tok, out.sequences[0, ids.shape[1]:].tolist(), out.stitch.roles, wants_colour(cfg.colour)))
    print(out.stitch.summary())
    return 0
