"""Runs the bad-input table (``cases.py``): every row gets a clear error or the correct result."""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import hf_rstitch  # noqa: F401  (the generate patch)
from hf_rstitch.router import Router
from tiny_models import make_pair, prompt

from badinput.cases import CASES, CliOutcome, Error


@dataclass
class Context:
    llm: torch.nn.Module
    slm: torch.nn.Module
    ids: torch.Tensor
    router_dir: Path
    tmp: Path

    def run_cli(self, argv: list[str]) -> CliOutcome:
        from hf_rstitch.cli.main import main

        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as stop:  # argparse's own errors
                code = stop.code
            except Exception:  # a traceback is what the CLI must never show
                import traceback

                traceback.print_exc(file=err)
                code = 1
        return CliOutcome(code, err.getvalue())

    def generate_load(self, dtype: str):
        from hf_rstitch.cli.generate import GenerateConfig, _load

        return _load(GenerateConfig(dtype=dtype))

    def toyworld_eval_config(self):
        from hf_rstitch.cli.toyworld import EvalConfig

        here = os.getcwd()
        os.chdir(self.tmp)
        try:
            return EvalConfig()
        finally:
            os.chdir(here)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    llm, slm = make_pair("llama")
    tmp = tmp_path_factory.mktemp("badinput")
    torch.manual_seed(0)
    Router(slm.config.hidden_size, width=8, num_blocks=1, threshold=0.3).double().save_pretrained(tmp / "router")
    return Context(llm, slm, prompt(), tmp / "router", tmp)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case, ctx):
    if isinstance(case.expect, Error):
        with pytest.raises(case.expect.type) as info:
            case.call(ctx)
        assert re.search(case.expect.match, str(info.value)), str(info.value)
    else:
        value = case.call(ctx)
        assert case.expect.check(value, ctx), value
