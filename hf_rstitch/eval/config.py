"""``EvalConfig``: every knob of an evaluation run, with help text and validation.

The CLI (``rstitch eval``) is generated from this dataclass and the Python API
(:func:`hf_rstitch.eval.evaluate`) takes it, so both reject bad input with the same message.
Importing this module is cheap (no torch), which keeps ``rstitch --help`` fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.config import EngineConfig, embeds_engine
from .data import DEFAULT_INSTRUCTION

METHOD_KINDS = ("llm", "slm", "specdec", "rstitch", "speculate", "random", "router", "step", "r2r")
DTYPES = ("auto", "float32", "float16", "bfloat16")
RECORDS, RUN_META = "records.jsonl", "run.json"  # an eval run's files under --out


def _help(text: str, **extra: Any) -> Any:
    return {"help": text, **extra}


@embeds_engine(fast_like_auto=True)
@dataclass
class EvalConfig:
    llm: str = field(default="", metadata=_help(
        "LLM checkpoint: local path, Hub id, or shipped:llm; with neither --llm nor --slm, the shipped pair."))
    slm: str = field(default="", metadata=_help(
        "SLM checkpoint (same tokenizer as the LLM): local path, Hub id, or shipped:slm; see --llm."))
    data: list[str] = field(default_factory=list, metadata=_help(
        "Benchmark(s): JSONL files with id/problem/answer per line, local .json/.csv/.parquet files, or Hub "
        "datasets owner/name[:split] or owner/name:config:split (needs `datasets`, in the eval extra; GSM8K and "
        "MATH-500 as published load as they are). Several give one Table-1 column group each."))
    columns: str = field(default="", metadata=_help(
        "Column mapping for --data whose columns are named otherwise, FIELD=COLUMN pairs: "
        "problem=question,answer=final_answer (fields: id, problem, answer; without an id the row number is used)."))
    methods: list[str] = field(default_factory=lambda: ["llm", "slm", "specdec", "rstitch", "random"], metadata=_help(
        "Methods to run: llm, slm, specdec (assisted generation), rstitch (one run per --thresholds), speculate "
        "(R-Stitch with the LLM's runs verified --speculate-k SLM drafts at a time: one run per --thresholds), "
        "random (one run per --random-p), router (R-Stitch+: needs --router), step (step-level routing, one run per "
        "--step-thresholds), r2r (R2R's router: needs --r2r-router; one run per --r2r-thresholds).",
        choices=METHOD_KINDS))
    thresholds: list[float] = field(default_factory=lambda: [0.001, 0.02, 0.03], metadata=_help(
        "R-Stitch entropy thresholds tau (normalized entropy, in [0, 1])."))
    random_p: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9], metadata=_help(
        "Random-routing probabilities: each SLM step goes to the LLM with probability p."))
    max_new_tokens: int = field(default=8192, metadata=_help("Decoding budget per problem (the paper uses 8k and 16k)."))
    do_sample: bool = field(default=False, metadata=_help("Sample instead of greedy decoding."))
    temperature: float = field(default=0.6, metadata=_help("Sampling temperature (with --do-sample)."))
    top_p: float = field(default=0.95, metadata=_help("Nucleus sampling p (with --do-sample)."))
    seed: int = field(default=0, metadata=_help("Seed for sampling and random routing (reset before every problem)."))
    limit: int | None = field(default=None, metadata=_help("Use only the first N problems of each dataset."))
    shard: str = field(default="0/1", metadata=_help(
        "i/n: run only the problems whose position modulo n is i, to split a run over n processes by hand (give "
        "each its own --out, then concatenate their records.jsonl into one folder and run --report-only). Under "
        "torchrun / accelerate launch leave it out: each process takes its shard (RANK / WORLD_SIZE) on its own GPU, "
        "and rank 0 merges the records into one report in --out."))
    out: str = field(default="benchmarks/results/eval", metadata=_help(
        "Output folder: records.jsonl, run.json, report.md, summary.json and plots."))
    device: str = field(default="auto", metadata=_help("Device for both models: auto (cuda if available), cuda, cuda:1, cpu."))
    dtype: str = field(default="auto", metadata=_help("Weights dtype; auto = bfloat16 on CUDA, float32 on CPU.",
                                                      choices=DTYPES))
    instruction: str | None = field(default=None, metadata=_help(
        "Instruction appended to every problem in the user turn (default: \"" + DEFAULT_INSTRUCTION + "\", none "
        "for the shipped pair, which was trained without it; rstitch tune prompts the same way). "
        "--instruction '' for none."))
    chat_template: bool = field(default=True, metadata=_help("Prompt through the tokenizer's chat template."))
    resume: bool = field(default=True, metadata=_help(
        "Skip (method, problem) pairs already in records.jsonl; --no-resume moves old records aside."))
    report_only: bool = field(default=False, metadata=_help(
        "Only re-tabulate existing records in --out (no models loaded)."))
    regrade: bool = field(default=False, metadata=_help("Re-grade stored outputs with the current grader when reporting."))
    warmup: bool = field(default=True, metadata=_help("One short untimed call per method before timing."))
    save_traces: bool = field(default=False, metadata=_help(
        "Store the full per-token decode trace of stitched methods in each record (large)."))
    plots: bool = field(default=True, metadata=_help("Write the trade-off and per-sample plots (matplotlib)."))
    progress: bool = field(default=True, metadata=_help("Show a progress bar."))
    batch_size: int | None = field(default=None, metadata=_help(
        "Problems decoded together through continuous batching (a finished problem's row goes to the next "
        "one at once); latency is then each problem's own time in the batch. Default: 16 on CUDA, 1 "
        "(the paper's per-sample latency) on CPU. Speculative decoding always runs at 1."))
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(fast_like_auto=True), metadata=_help(
        "Engine that runs the problems (hf_rstitch.engine.EngineConfig; --engine its kind): auto (the default, or "
        "$HF_RSTITCH_ENGINE: fast where it runs the pair, else default, the reason logged), default (eager lanes, "
        "any device and model) or fast (static caches + CUDA graphs, compile='parts' on CUDA; full-attention "
        "single-GPU models). Where the fast engine runs, every method but SpecDec goes through the request engine, "
        "at batch size 1 too, and with --warmup its graphs are captured before timing.", embed=["kind"]))
    schedule: str = field(default="now", metadata=_help(
        "When the LLM runs for rows that need it in a batch (--batch-size > 1): now (at once), or gather[:K[:M]]: "
        "such rows wait (no token) at most K steps (default 2) until M rows need it (default a quarter of the batch), while "
        "the SLM's rows go on: fewer LLM calls, the same outputs, full-attention models only. Measured slower on an "
        "H200 (7B/1.5B, B=4-64); see docs/howto/batching.md."))
    router: Any = field(default=None, metadata={"cli": False, "help": "Router object or folder for the 'router' method."})
    router_path: str = field(default="", metadata=_help(
        "R-Stitch+ router for the 'router' method: a local folder, a Hub id, or shipped (the shipped pair's router)."))
    router_threshold: float | None = field(default=None, metadata=_help(
        "Entropy threshold under which the router is not consulted (default: the one it was trained with)."))
    step_thresholds: list[float] = field(default_factory=lambda: [0.005, 0.02], metadata=_help(
        "Step-level routing (method 'step'): the SLM entropy at a step's first token above which the LLM writes the step."))
    step_delimiter: str = field(default="\n\n", metadata=_help(
        "Step-level routing: the text that ends a reasoning step (a blank line; '.' for the shipped toy pair)."))
    r2r_router: str = field(default="", metadata=_help(
        "R2R router for the 'r2r' method: its .pt file, a folder of one (R2R's router collection) or a Hub id."))
    r2r_thresholds: list[float] = field(default_factory=list, metadata=_help(
        "R2R probability cut-offs (one run each); none: the router's own."))
    speculate_k: int = field(default=4, metadata=_help(
        "Method 'speculate': SLM drafts the LLM verifies in one forward while it has control (stitch_speculate)."))

    def __post_init__(self) -> None:
        if isinstance(self.data, str):
            self.data = [self.data]
        from ..resources import resolve

        if not self.llm and not self.slm and not self.report_only:  # as generate / serve / demo: the shipped pair
            self.llm, self.slm = "shipped:llm", "shipped:slm"
        self.llm, self.slm = resolve(self.llm), resolve(self.slm)  # shipped:llm -> its folder
        if self.instruction is None:
            from .data import default_instruction

            self.instruction = default_instruction(self.llm, self.slm)
        if not self.report_only:
            self._check_sources()
        from .data import parse_columns

        parse_columns(self.columns)  # a malformed mapping fails here, before any model loads
        self._check_methods()
        self._check_decoding()

    def _check_sources(self) -> None:
        """Models, data and device exist, before any model loads."""
        if bool(self.llm) != bool(self.slm):
            raise ValueError("pass both --llm and --slm (local folders or Hub ids), or neither (the shipped pair).")
        if not self.data:
            raise ValueError("--data is required: one or more JSONL files with id/problem/answer per line, "
                             "other local files or Hub dataset ids.")
        from ..sources import check_device, check_local_source

        check_local_source(self.llm, "--llm")
        check_local_source(self.slm, "--slm")
        if self.router_path and "router" in self.methods and self.router_path != "shipped":
            check_local_source(self.router_path, "--router-path", needs=("config.json", "model.safetensors"),
                               what="a router saved with Router.save_pretrained (train-router writes OUT/router)")
        check_device(self.device)

    def _check_methods(self) -> None:
        """Known methods, each once, with the values they need."""
        bad = [m for m in self.methods if m not in METHOD_KINDS]
        if bad or not self.methods:
            raise ValueError(f"unknown method(s) {bad}; choose from {list(METHOD_KINDS)}.")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"--methods lists a method twice: {self.methods}.")
        for name, values in (("thresholds", self.thresholds), ("random_p", self.random_p),
                             ("step_thresholds", self.step_thresholds), ("r2r_thresholds", self.r2r_thresholds)):
            for v in values:
                if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
                    raise ValueError(f"--{name.replace('_', '-')} values must be in [0, 1], got {v!r}.")
            twice = sorted({float(v) for v in values if [float(x) for x in values].count(float(v)) > 1})
            if twice:
                raise ValueError(f"--{name.replace('_', '-')} lists {twice} more than once; give each value once "
                                 "(every value is one method, run once per problem).")
        if "step" in self.methods and not self.step_thresholds:
            raise ValueError("method 'step' needs at least one --step-thresholds value (e.g. 0.02).")
        if "r2r" in self.methods and not self.r2r_router and not self.report_only:
            raise ValueError("method 'r2r' needs an R2R router: --r2r-router PATH_OR_HUB_ID (R2R's .pt, or a folder of one).")
        for kind in ("rstitch", "speculate"):
            if kind in self.methods and not self.thresholds:
                raise ValueError(f"method {kind!r} needs at least one --thresholds value (e.g. 0.02).")
        if "speculate" in self.methods and (isinstance(self.speculate_k, bool) or not isinstance(self.speculate_k, int)
                                            or self.speculate_k < 1):
            raise ValueError(f"--speculate-k must be a whole number of draft tokens >= 1, got {self.speculate_k!r}.")
        if "speculate" in self.methods and self.do_sample:
            raise ValueError("method 'speculate' verifies drafts greedily only; drop --do-sample or the method.")
        if "random" in self.methods and not self.random_p:
            raise ValueError("method 'random' needs at least one --random-p value (e.g. 0.5).")
        if self.router is None and self.router_path:
            self.router = self.router_path
        if "router" in self.methods and self.router is None and not self.report_only:
            raise ValueError("method 'router' needs a router: --router-path FOLDER_OR_HUB_ID "
                             "(e.g. shipped), or EvalConfig(router=...) in Python.")
        rt = self.router_threshold
        if rt is not None and (isinstance(rt, bool) or not isinstance(rt, (int, float))
                               or not (math.isfinite(rt) and 0.0 <= rt <= 1.0)):
            raise ValueError(f"--router-threshold must be a number in [0, 1] (normalized entropy), got {rt!r}; "
                             "leave it out to use the threshold the router was trained with.")

    def _check_decoding(self) -> None:
        """Budget, sampling, sharding, dtype and batch size."""
        if self.max_new_tokens <= 0:
            raise ValueError(f"--max-new-tokens must be positive, got {self.max_new_tokens}.")
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"--limit must be positive, got {self.limit}.")
        if self.do_sample and not (self.temperature > 0 and 0 < self.top_p <= 1):
            raise ValueError(f"sampling needs temperature > 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}.")
        try:
            i, n = (int(x) for x in self.shard.split("/"))
        except ValueError:
            raise ValueError(f"--shard must look like i/n, e.g. 0/4, got {self.shard!r}.") from None
        if not 0 <= i < n:
            raise ValueError(f"--shard {self.shard}: need 0 <= i < n.")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}.")
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise ValueError(f"--batch-size must be a positive integer, got {self.batch_size!r}.")
        from ..core.scheduling import parse_schedule

        try:
            parse_schedule(self.schedule)
        except ValueError as e:
            raise ValueError(f"--schedule: {e}") from None

    def batch_size_on(self, device: str) -> int:
        """``batch_size``, or its default for ``device``: 16 on CUDA, 1 elsewhere."""
        if self.batch_size is not None:
            return self.batch_size
        return 16 if str(device).startswith("cuda") else 1

    def shard_of(self, problems: list) -> list:
        """The problems this shard runs (all of them for the default 0/1)."""
        i, n = (int(x) for x in self.shard.split("/"))
        return [p for k, p in enumerate(problems) if k % n == i]

    def run_settings(self) -> dict[str, Any]:
        """What must match for records to be resumed or compared."""
        return {k: getattr(self, k) for k in ("llm", "slm", "max_new_tokens", "do_sample", "temperature", "top_p",
                                              "seed", "instruction", "chat_template", "dtype")}
