"""``rstitch export-hub-template DIR``: write a Hub ``custom_generate`` repo that runs R-Stitch.

Thin wrapper over :func:`hf_rstitch.hub_template.export`; see that module for what the folder holds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from ..hf.settings import DEFAULT_THRESHOLD
from .args import add_dataclass_args, dataclass_from_args

NAME = "export-hub-template"
HELP = "write a Hub custom_generate repo (generate.py, requirements.txt, README) that runs R-Stitch without hf-rstitch"
DESCRIPTION = (
    "Flattens hf-rstitch's decode path into DIR/custom_generate/generate.py and adds requirements.txt and a README "
    "tagged custom_generate. Push DIR to a Hub repo (e.g. `hf upload <org>/<repo> DIR`), then "
    "llm.generate(**inputs, custom_generate='<org>/<repo>', trust_remote_code=True, assistant_model=slm, "
    f"stitch_threshold={DEFAULT_THRESHOLD}) works with only torch and transformers installed. A local DIR works the same way."
)


@dataclass
class ExportConfig:
    dir: str = field(default="", metadata={"help": "output folder (created; must be empty unless --overwrite)",
                                           "cli": False})
    repo_id: str = field(default="<org>/<repo>", metadata={"help": "Hub id the folder will be pushed to (README examples)"})
    overwrite: bool = field(default=False, metadata={"help": "replace the exported files in a non-empty folder"})
    threshold: float | None = field(default=None, metadata={
        "help": "default tau: every generate through the template then stitches (stitch=False opts out)"})
    slm: str = field(default="", metadata={
        "help": "SLM used when a call passes no assistant_model: a Hub id (or a folder on the machine that loads the "
                "repo). With --space: the Space's SLM"})
    router: str = field(default="", metadata={"help": "default R-Stitch+ router, Hub id or folder (needs hf-rstitch where it runs)"})
    llm: str = field(default="", metadata={
        "help": "also save this LLM (Hub id, folder or shipped:llm) with its tokenizer into DIR: a model repo that "
                "pipeline and `transformers serve --trust-remote-code` load. With --space: the Space's LLM"})
    space: bool = field(default=False, metadata={
        "help": "write a Gradio Space instead (app.py, requirements.txt, README.md with sdk: gradio, and the package): "
                "the `rstitch ui` page for --llm / --slm (default: the shipped pair) and --router"})

    def __post_init__(self):
        if not self.dir:
            raise ValueError("give the output folder: rstitch export-hub-template DIR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help=ExportConfig.__dataclass_fields__["dir"].metadata["help"])
    add_dataclass_args(parser, ExportConfig)


def run(args: argparse.Namespace) -> int:
    cfg = dataclass_from_args(ExportConfig, args)
    if cfg.space:
        return _space(cfg)
    from ..hub_template import ExportError, export

    try:
        out = export(cfg.dir, repo_id=cfg.repo_id, overwrite=cfg.overwrite, threshold=cfg.threshold,
                     slm=cfg.slm or None, router=cfg.router or None, llm=cfg.llm or None)
    except (FileExistsError, ExportError, ValueError, OSError) as err:
        print(f"rstitch export-hub-template: error: {err}", file=sys.stderr)
        return 2
    what = "the LLM, " if cfg.llm else ""
    tau = cfg.threshold if cfg.threshold is not None else DEFAULT_THRESHOLD
    print(f"wrote {what}{out}/custom_generate/generate.py, requirements.txt and README.md; "
          f"load it with llm.generate(..., custom_generate={str(out)!r}, trust_remote_code=True, assistant_model=slm, "
          f"stitch_threshold={tau})" + (f" or AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
                                      if cfg.llm else "") + ", or push the folder to the Hub")
    return 0


def _space(cfg: ExportConfig) -> int:
    """``--space``: the Gradio Space (:mod:`hf_rstitch.ui.space`)."""
    from ..ui.space import export_space

    if cfg.threshold is not None:
        print("rstitch export-hub-template: error: --threshold does not apply to --space: the page's slider defaults "
              "to the LLM's generation_config.stitch_threshold (rstitch tune writes it)", file=sys.stderr)
        return 2
    try:
        out = export_space(cfg.dir, cfg.llm or None, cfg.slm or None, cfg.router or None, overwrite=cfg.overwrite)
    except (FileExistsError, ValueError, OSError) as err:
        print(f"rstitch export-hub-template: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote the Space {out} (app.py, requirements.txt, README.md, hf_rstitch/); try it with "
          f"`cd {out} && python app.py`, or push it: hf upload <org>/<space> {out} --repo-type space")
    return 0
