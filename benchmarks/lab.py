"""What the lab's scripts share: device sync, timing, random-weight pairs, routes, result files.

The library measures (:func:`hf_rstitch.eval.sweep` for accuracy and token counts,
:func:`hf_rstitch.fast.routes.route` for synthetic routes, the latency profiler for Eq. 4); this
module only holds what a benchmark script needs around it. Scripts import it as a sibling
(``from lab import ...``) and are run from the repository root, e.g.
``PYTHONPATH=. python benchmarks/batch_bench.py``. Every result a script writes names the
command that regenerates it (:func:`write_result`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from hf_rstitch.fast.routes import route, switches  # noqa: F401  (the one synthetic-route generator)
from hf_rstitch.latency.profiler import synchronize

RESULTS = Path(__file__).resolve().parent / "results"


def add_profile(ap) -> None:
    """The ``--profile`` flag: which GPU features the fast engine uses (:mod:`hf_rstitch.fast.capabilities`)."""
    from hf_rstitch.fast import capabilities

    ap.add_argument("--profile", default="native", choices=capabilities.PROFILES, help=(
        "native: what this GPU has; generic: what an Ampere / Ada GPU gets (every Hopper-only feature off: "
        "HF_RSTITCH_PROFILE=generic and Triton's DISABLE_MMA_V3=1 for this process and its children)"))


def apply_profile(name: str) -> str:
    """Set ``name``'s environment (before anything compiles; children inherit it); the result files' suffix."""
    from hf_rstitch.fast import capabilities

    if name == "native":
        return ""
    os.environ[capabilities.PROFILE_ENV] = name
    os.environ.update(capabilities.triton_environment(name))
    return f"_{name}"


def sync(*devices: torch.device | str | None) -> None:
    """Wait for every named device (all of them: CUDA's current one when none is named)."""
    if not devices:
        devices = ("cuda",) if torch.cuda.is_available() else ()
    for d in {torch.device(d) for d in devices if d is not None}:
        synchronize(d)


def timed(fn: Callable[[], Any], *devices: torch.device | str, repeats: int = 1) -> tuple[float, Any]:
    """``(median wall seconds over repeats, last output)`` of ``fn``, devices synchronised around each run."""
    times, out = [], None
    for _ in range(repeats):
        sync(*devices)
        t0 = time.perf_counter()
        out = fn()
        sync(*devices)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def command() -> str:
    """The command line that ran this script, to store beside its results."""
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def environment(devices: Iterable[torch.device | str] = ()) -> dict[str, Any]:
    """Device names, library versions, date and the command: the header of every result file."""
    import transformers

    names = [torch.cuda.get_device_name(torch.device(d)) if torch.device(d).type == "cuda"
             else platform.processor() or "cpu" for d in devices]
    return {"devices": names, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command()}


def file_tag(device: str) -> str:
    """The device part of a result file's name: ``cpu``, or the GPU's name in lower case with ``_`` for the rest
    (``NVIDIA H200`` -> ``nvidia_h200``)."""
    if not str(device).startswith("cuda"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(torch.device(device)).lower()).strip("_")


def device_name(device: str) -> str:
    """A GPU's name, or the CPU's model and core count (the ``device`` field of a result)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    info = Path("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                  if line.startswith("model name")), "") if info.exists() else ""
    return f"CPU ({model or platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()})"


def write_result(stem: str | Path, doc: dict[str, Any], markdown: str = "") -> None:
    """``stem.json`` (``doc`` plus the regenerating command, if missing) and ``stem.md`` (a table)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command(), **doc}
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if markdown:
        stem.with_suffix(".md").write_text(markdown.rstrip() + f"\n\nRegenerate: `{doc['command']}`\n")


CHILD_RESULT = "RESULT "  # prefix of the line a child process prints its result on (:func:`run_child`)


def in_own_process(fn: Callable, *args) -> int:
    """``fn(*args)`` in a spawned process (a GPU of its own: nothing an earlier engine of this process kept),
    waited for; its exit code. A SIGTERM to this process ends the child too, so that it does not hold the GPU on."""
    import multiprocessing
    import signal

    proc = multiprocessing.get_context("spawn").Process(target=fn, args=args)
    proc.start()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        proc.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return proc.exitcode


def run_child(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run ``cmd`` (a script in a fresh process); its last ``CHILD_RESULT`` line as a dict plus ``process_s``, or
    ``{"error": ...}`` (the time-out, or the end of its output when it failed or printed no result)."""
    import subprocess

    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(CHILD_RESULT)]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout)[-2000:]}
    return {**json.loads(lines[-1][len(CHILD_RESULT):]), "process_s": time.perf_counter() - t0}


def tiny_qwen2(hidden: int, layers: int, seed: int, device: str = "cpu", dtype: torch.dtype = torch.float32,
               vocab: int = 256):
    """A seeded random Qwen2 for CPU smoke runs of the GPU benchmarks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2)
    return Qwen2ForCausalLM(cfg).to(device, dtype).eval()


def random_pair(shape: str, device: str, dtype: torch.dtype = torch.bfloat16, tiny_layers: int = 3):
    """``(llm, slm)``, seeded, on ``device``: random Qwen2 7B + 1.5B shapes (``qwen2``), or a tiny pair (``tiny``)."""
    if shape == "tiny":
        return tiny_qwen2(64, tiny_layers, 0, device, dtype), tiny_qwen2(32, 2, 1, device, dtype)
    from hf_rstitch.latency.profiler import random_qwen2

    return random_qwen2("7b", dtype, device, seed=0), random_qwen2("1.5b", dtype, device, seed=1)


def share_route(n: int, llm_share: float, llm_run: float, seed: int) -> list[str]:
    """A route of ``n`` roles with about ``llm_share`` LLM tokens in runs of mean length ``llm_run``."""
    return route(n, round(llm_share * n), llm_run, seed=seed)


def switch_route(n: int, n_switches: int, seed: int) -> list[str]:
    """A route of ``n`` roles with about ``n_switches`` control changes (half the tokens the LLM's)."""
    if n_switches <= 0:
        return ["slm"] * n
    llm_tokens = n // 2
    return route(n, llm_tokens, max(1.0, llm_tokens / max(1, (n_switches + 1) // 2)), seed=seed)


# the policies a benchmark row runs (its ``policy`` field): the entropy rule and the router (R-Stitch+) decide the
# route from the models' forced entropies (RoutedPair); a replay skips the policy (the bound the others approach)
POLICIES = ("entropy", "router", "replay")
TAU = 0.02  # their threshold; forced entropies sit at ~0.99 and ~1e-12, far either side


class RoutedPair:
    """A pair whose entropies follow the routes a call is given (:class:`hf_rstitch.fast.forced_routes.ForcedEntropies`
    on both models, hooks installed until :meth:`close`), and the policy that decides them (:meth:`policy`).

    ``rows``: the most rows a forward runs (a fast lane's largest batch bucket); ``positions``: the longest
    sequence. Every policy, the replay included, runs on the same forced models: their figures compare."""

    def __init__(self, llm, slm, rows: int, positions: int):
        from hf_rstitch.fast.forced_routes import ForcedEntropies

        vocab = min(llm.config.get_text_config().vocab_size, slm.config.get_text_config().vocab_size)
        self.slm = slm
        self.forced = [ForcedEntropies(m, role, rows, positions, vocab) for m, role in ((llm, "llm"), (slm, "slm"))]

    def policy(self, kind: str, routes: list, prompt: int, device=None):
        """The ``kind`` policy (:data:`POLICIES`) for a call decoding ``routes`` (one, or one a row) after prompts of
        ``prompt`` tokens, the entropies forced to follow them; ``device``: a replay's decisions come back there."""
        from hf_rstitch import EntropyPolicy, ReplayPolicy
        from hf_rstitch.router.model import Router
        from hf_rstitch.router.policy import RouterPolicy

        if kind not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {kind!r}")
        for forced in self.forced:
            forced.follow(routes, prompt)
        if kind == "replay":
            return ReplayPolicy(routes, device=device)
        if kind == "entropy":
            return EntropyPolicy(TAU)
        # the paper's router sizes, voting for the LLM wherever it is asked: the route stays the recorded one
        router = Router(self.slm.config.get_text_config().hidden_size, llm_bias=20.0).to(self.slm.device).eval()
        return RouterPolicy(router, TAU)

    def close(self) -> None:
        for forced in self.forced:
            forced.close()


def roles_match(out, routes: list) -> bool:
    """Whether a ``generate(..., return_dict_in_generate=True)`` output's traces follow ``routes`` (one, or one a
    row)."""
    routes = [routes] if routes and isinstance(routes[0], str) else routes
    traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
    return all([str(r) for r in t.roles] == list(routes[min(i, len(routes) - 1)]) for i, t in enumerate(traces))


# paper, MATH, 7B pair, 8k budget: tokens a problem, LLM runs of ~4 tokens; the benchmarks' 128-token prompts
MATH = {"llm_only_tokens": 2753, "llm_tokens": 344, "slm_tokens": 771, "llm_run": 4.0, "prompt": 128}


class Budget:
    """Seconds left of a script's time budget (a device call's limit): sections that would not fit are skipped."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def allows(self, need: float) -> bool:
        return self.left() >= need


def copy_bandwidth(device: str = "cuda", nbytes: int | None = None, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written (median of repeats); 2 GiB on CUDA,
    16 MiB on the CPU (a dry run)."""
    nbytes = nbytes or (2 << 30 if device == "cuda" else 1 << 24)
    if device != "cuda":
        src = torch.randn(nbytes // 2, dtype=torch.bfloat16)
        return 2 * nbytes / timed(lambda: src.clone())[0] / 1e9
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times) / 1e9


def weight_bytes(model) -> dict:
    """All parameter bytes (tied tensors once), and the bytes a decode step must read."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    emb = model.get_input_embeddings().weight
    tied = emb.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    read = total - (0 if tied else emb.numel() * emb.element_size())  # one embedding row per token
    return {"weight_bytes": total, "decode_read_bytes": read, "tied_embeddings": tied}


def prompt_ids(vocab: int, length: int, device: str = "cuda") -> torch.Tensor:
    """``[1, length]`` seeded random token ids below ``vocab``."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (1, length), generator=g).to(device)


def host_profiled(fn, top: int):
    """``(profiled fn, report)``: ``fn`` under cProfile, and a function giving its ``top`` functions by cumulative
    and by own host seconds (``[seconds, own seconds, calls, "file:line(function)"]``) once it ran."""
    import cProfile
    import pstats

    prof = cProfile.Profile()

    def run():
        prof.enable()
        try:
            return fn()
        finally:
            prof.disable()

    def report():
        stats = pstats.Stats(prof).stats
        rows = [[round(ct, 3), round(tt, 3), nc, f"{Path(f).name}:{line}({name})"]
                for (f, line, name), (_, nc, tt, ct, _) in stats.items()]
        return {"cumulative": sorted(rows, reverse=True)[:top], "own": sorted(rows, key=lambda r: -r[1])[:top]}

    return run, report
