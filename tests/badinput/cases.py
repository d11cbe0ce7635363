"""The bad-input table: one row per case, over the public Python API and the ``rstitch`` CLI.

Each row is ``Case(id, call, expect)``:

* ``call(ctx)`` does one thing a user could do; ``ctx`` (see ``test_badinput.py``) holds a tiny
  seeded LLM/SLM pair, a prompt, a router saved for the SLM and a scratch folder.
* ``expect`` is either ``Error(ExceptionType, "regex")`` -- the call must raise that type with a
  message matching the regex (a clear error: what was wrong and what to do) -- or
  ``Result(check)`` -- the call must succeed and ``check(value, ctx)`` must hold (the correct
  result, e.g. equal to the same call with a plain float).

CLI rows use :func:`cli`: ``rstitch ARGS`` run in-process must exit with status 2 and print a
one-line ``rstitch ...: error: ...`` matching the regex on stderr, with no traceback.

To add a case, append a row. Keep each row fast (tiny models, a few tokens, failing before any
real model loads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch


@dataclass(frozen=True)
class Error:
    type: type
    match: str


@dataclass(frozen=True)
class Result:
    check: Callable[[Any, Any], bool]


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[Any], Any]
    expect: Error | Result


@dataclass(frozen=True)
class CliOutcome:
    code: int
    err: str


def cli(*argv: str) -> Callable[[Any], CliOutcome]:
    def run(ctx):
        return ctx.run_cli(list(argv))
    return run


def cli_error(case_id: str, argv: list[str], match: str) -> Case:
    """A CLI row: exit status 2, the message on stderr, no traceback."""
    def check(outcome: CliOutcome, ctx) -> bool:
        import re

        return (outcome.code == 2 and "Traceback" not in outcome.err and "error:" in outcome.err
                and re.search(match, outcome.err) is not None)
    return Case(case_id, cli(*argv), Result(check))


# --- helpers the rows call ---------------------------------------------------------------------------

def stitched(ctx, **kw):
    """New tokens of a stitched generate on the tiny pair (greedy, 6 tokens)."""
    out = ctx.llm.generate(ctx.ids, assistant_model=ctx.slm, max_new_tokens=6, do_sample=False, **kw)
    return out[0, ctx.ids.shape[1]:].tolist()


def same_as_float(tau: float):
    return Result(lambda value, ctx: value == stitched(ctx, stitch_threshold=float(tau)))


class Scores:
    """A custom policy whose hand_to_llm returns ``make(entropy)``; back to the SLM by entropy."""

    needs_hidden = False

    def __init__(self, make):
        self.make = make

    def reset(self):
        pass

    def hand_to_llm(self, step):
        return self.make(step.entropy)

    def hand_to_slm(self, step):
        return step.entropy <= 0.3


def same_as_bool_policy():
    return Result(lambda value, ctx: value == stitched(ctx, stitch_policy=Scores(lambda h: h > 0.3)))


def empty_folder(ctx) -> str:
    path = ctx.tmp / "empty_router"
    path.mkdir(exist_ok=True)
    return str(path)


def corrupt_router(ctx) -> str:
    import shutil

    path = ctx.tmp / "corrupt_router"
    shutil.copytree(ctx.router_dir, path, dirs_exist_ok=True)
    (path / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file")
    return str(path)


def eval_config(**kw):
    from hf_rstitch.eval import EvalConfig

    return EvalConfig(**{"llm": "owner/llm", "slm": "owner/slm", "data": ["x.jsonl"], **kw})


def train_config(**kw):
    from hf_rstitch.router.config import RouterTrainConfig

    return RouterTrainConfig(**kw)


NO_CUDA = not torch.cuda.is_available()
NAN = float("nan")
EVAL_ARGS = ["eval", "--llm", "owner/llm", "--slm", "owner/slm", "--data", "x.jsonl"]

# --- the table --------------------------------------------------------------------------------------

CASES: list[Case] = [
    # thresholds: numbers of any numeric type work, everything else is a clear error
    Case("threshold-numpy-float32", lambda c: stitched(c, stitch_threshold=np.float32(0.3)),
         same_as_float(np.float32(0.3))),
    Case("threshold-numpy-float64", lambda c: stitched(c, stitch_threshold=np.float64(0.3)), same_as_float(0.3)),
    Case("threshold-0d-tensor", lambda c: stitched(c, stitch_threshold=torch.tensor(0.3, dtype=torch.float64)),
         same_as_float(0.3)),
    Case("threshold-0d-array", lambda c: stitched(c, stitch_threshold=np.array(0.3)), same_as_float(0.3)),
    Case("threshold-numpy-int", lambda c: stitched(c, stitch_threshold=np.int64(1)), same_as_float(1.0)),
    Case("threshold-nan", lambda c: stitched(c, stitch_threshold=NAN), Error(ValueError, r"finite number in \[0, 1\]")),
    Case("threshold-negative", lambda c: stitched(c, stitch_threshold=-0.1), Error(ValueError, r"in \[0, 1\]")),
    Case("threshold-above-one", lambda c: stitched(c, stitch_threshold=1.5), Error(ValueError, r"in \[0, 1\]")),
    Case("threshold-string", lambda c: stitched(c, stitch_threshold="0.1"), Error(TypeError, "must be a number")),
    Case("threshold-bool", lambda c: stitched(c, stitch_threshold=True), Error(TypeError, "must be a number")),
    Case("threshold-2-element-tensor", lambda c: stitched(c, stitch_threshold=torch.tensor([0.1, 0.2])),
         Error(TypeError, "must be a number")),
    # custom policies: 0/1 answers of any type work, scores and wrong shapes are clear errors
    Case("policy-int-tensor", lambda c: stitched(c, stitch_policy=Scores(lambda h: (h > 0.3).long())),
         same_as_bool_policy()),
    Case("policy-float-0-1", lambda c: stitched(c, stitch_policy=Scores(lambda h: (h > 0.3).double())),
         same_as_bool_policy()),
    Case("policy-list-of-bools", lambda c: stitched(c, stitch_policy=Scores(lambda h: (h > 0.3).tolist())),
         same_as_bool_policy()),
    Case("policy-float-scores", lambda c: stitched(c, stitch_policy=Scores(lambda h: h)),
         Error(TypeError, r"must return a \[1\] bool tensor .* e\.g\. `return probs > 0\.5`")),
    Case("policy-wrong-shape", lambda c: stitched(c, stitch_policy=Scores(lambda h: (h > 0.3)[:, None])),
         Error(ValueError, r"returned shape \(1, 1\); expected \[1\]")),
    Case("policy-returns-none", lambda c: stitched(c, stitch_policy=Scores(lambda h: None)),
         Error(TypeError, "must return a")),
    Case("policy-not-a-policy", lambda c: stitched(c, stitch_policy=object()),
         Error(TypeError, "must implement hand_to_llm")),
    # routers: a saved folder works; missing, empty, corrupt or non-path arguments are clear errors
    Case("router-folder", lambda c: stitched(c, stitch_router=str(c.router_dir)),
         Result(lambda v, c: len(v) == 6)),
    Case("router-missing-path", lambda c: stitched(c, stitch_router="./no/such/router"),
         Error(FileNotFoundError, "no such folder")),
    Case("router-empty-folder", lambda c: stitched(c, stitch_router=empty_folder(c)),
         Error(FileNotFoundError, "has no config.json / model.safetensors")),
    Case("router-corrupt-weights", lambda c: stitched(c, stitch_router=corrupt_router(c)),
         Error(ValueError, "cannot load a router from .*corrupt")),
    Case("router-int", lambda c: stitched(c, stitch_router=5),
         Error(TypeError, "a router must be a Router, a local folder or a Hub id")),
    Case("router-empty-string", lambda c: stitched(c, stitch_router=""), Error(ValueError, "router path is empty")),
    Case("router-threshold-nan", lambda c: stitched(c, stitch_router=str(c.router_dir), stitch_threshold=NAN),
         Error(ValueError, "finite number")),
    # eval configuration (Python API; the CLI builds the same object)
    Case("eval-router-threshold-nan", lambda c: eval_config(router_threshold=NAN),
         Error(ValueError, r"--router-threshold must be a number in \[0, 1\]")),
    Case("eval-router-threshold-2", lambda c: eval_config(router_threshold=2.0), Error(ValueError, "router-threshold")),
    Case("eval-repeated-threshold", lambda c: eval_config(thresholds=[0.02, 0.02]),
         Error(ValueError, "more than once")),
    Case("eval-repeated-random-p", lambda c: eval_config(random_p=[0.5, 0.5]), Error(ValueError, "more than once")),
    Case("eval-close-thresholds-are-two-methods", lambda c: eval_config(thresholds=[0.001, 0.001000001]),
         Result(lambda cfg, c: len(cfg.thresholds) == 2)),
    Case("eval-threshold-nan", lambda c: eval_config(thresholds=[NAN]), Error(ValueError, r"in \[0, 1\]")),
    Case("eval-missing-llm-folder", lambda c: eval_config(llm="./no/such/llm"),
         Error(FileNotFoundError, "--llm ./no/such/llm: no such folder")),
    Case("eval-llm-folder-without-config", lambda c: eval_config(llm=empty_folder(c)),
         Error(FileNotFoundError, "has no config.json")),
    Case("eval-missing-router-path", lambda c: eval_config(methods=["router"], router_path="./no/router"),
         Error(FileNotFoundError, "--router-path ./no/router: no such folder")),
    Case("eval-router-path-empty-folder", lambda c: eval_config(methods=["router"], router_path=empty_folder(c)),
         Error(FileNotFoundError, "has no config.json / model.safetensors")),
    Case("eval-max-new-tokens-0", lambda c: eval_config(max_new_tokens=0), Error(ValueError, "must be positive")),
    Case("eval-bad-shard", lambda c: eval_config(shard="3/2"), Error(ValueError, "0 <= i < n")),
    Case("eval-bad-device", lambda c: eval_config(device="gpu0"), Error(ValueError, "not a torch device")),
    # router training configuration
    Case("train-steps-0", lambda c: train_config(steps=0), Error(ValueError, "--steps must be positive")),
    Case("train-threshold-nan", lambda c: train_config(threshold=NAN), Error(ValueError, "--threshold")),
    Case("train-missing-models", lambda c: train_config(llm="./no/llm", slm="./no/slm"),
         Error(FileNotFoundError, "no such folder")),
    # CLI: every bad option is one error line, never a traceback
    cli_error("cli-generate-missing-folder", ["generate", "--llm", "./no/llm", "--slm", "./no/slm"],
              "--llm ./no/llm: no such folder"),
    cli_error("cli-generate-threshold-nan", ["generate", "--threshold", "nan"], "finite number"),
    cli_error("cli-generate-max-new-tokens-0", ["generate", "--max-new-tokens", "0"], "must be positive"),
    cli_error("cli-generate-bad-device", ["generate", "--device", "gpu0"], "not a torch device"),
    cli_error("cli-demo-n-601", ["demo", "--n", "601"], "exceeds the 600 shipped test problems"),
    cli_error("cli-demo-n-0", ["demo", "--n", "0"], "--n must be at least 1"),
    cli_error("cli-demo-max-new-tokens-0", ["demo", "--max-new-tokens", "0"], "must be positive"),
    cli_error("cli-toyworld-eval-n-negative", ["toyworld", "eval", "--n", "-1"], r"--n must be >= 0"),
    cli_error("cli-toyworld-eval-batch-size-0", ["toyworld", "eval", "--batch-size", "0"], "--batch-size"),
    cli_error("cli-toyworld-eval-missing-model", ["toyworld", "eval", "--model", "./no/model"], "no such folder"),
    cli_error("cli-toyworld-eval-missing-data", ["toyworld", "eval", "--data", "./no/data.jsonl"], "no such file"),
    cli_error("cli-toyworld-train-steps-0", ["toyworld", "train", "--preset", "tiny", "--steps", "0"], "--steps 0"),
    cli_error("cli-toyworld-train-batch-size-0", ["toyworld", "train", "--preset", "tiny", "--batch-size", "0"],
              "--batch-size 0"),
    cli_error("cli-eval-router-threshold-nan", EVAL_ARGS + ["--router-threshold", "nan"], "router-threshold"),
    cli_error("cli-eval-repeated-threshold", EVAL_ARGS + ["--thresholds", "0.02", "0.02"], "more than once"),
    cli_error("cli-eval-missing-llm", ["eval", "--llm", "./no/llm", "--slm", "owner/slm", "--data", "x.jsonl"],
              "no such folder"),
    cli_error("cli-train-router-steps-0", ["train-router", "--steps", "0"], "--steps must be positive"),
    cli_error("cli-train-router-missing-models", ["train-router", "--llm", "./no/llm", "--slm", "./no/slm"],
              "no such folder"),
    # CLI: options that must take effect
    Case("cli-generate-dtype-shipped-pair", lambda c: c.generate_load("bfloat16"),
         Result(lambda models, c: all(p.dtype == torch.bfloat16 for m in models[:2] for p in m.parameters()))),
    Case("cli-toyworld-eval-default-model-any-cwd", lambda c: c.toyworld_eval_config(),
         Result(lambda cfg, c: Path(cfg.model).is_absolute() and (Path(cfg.model) / "config.json").exists())),
]

if NO_CUDA:  # only meaningful where CUDA is missing
    CASES += [
        Case("eval-device-cuda-without-cuda", lambda c: eval_config(device="cuda"),
             Error(ValueError, "CUDA is not available")),
        cli_error("cli-generate-device-cuda", ["generate", "--device", "cuda"], "CUDA is not available"),
        cli_error("cli-demo-device-cuda", ["demo", "--device", "cuda"], "CUDA is not available"),
        cli_error("cli-toyworld-eval-device-cuda", ["toyworld", "eval", "--device", "cuda"], "CUDA is not available"),
        cli_error("cli-train-router-device-cuda", ["train-router", "--device", "cuda"], "CUDA is not available"),
        cli_error("cli-eval-device-cuda", EVAL_ARGS + ["--device", "cuda"], "CUDA is not available"),
    ]

assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
