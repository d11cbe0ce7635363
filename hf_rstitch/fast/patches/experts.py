"""MoE feed-forwards on the fast path: an expert dispatch that stays on the device, so a step with
experts in it can be captured in a CUDA graph.

transformers' default dispatch (``"eager"``: a Python loop over ``nonzero()`` of the experts hit) reads
the routing back to the host every layer -- no graph can hold it -- and its ``"grouped_mm"`` runs a host
loop where the fused grouped GEMM does not exist (dtypes other than bfloat16, older GPUs). The lane runs
its forwards with one of transformers' own experts implementations (``config._experts_implementation``,
the ``use_experts_implementation`` decorator; both exist from transformers 5.17), picked by
:func:`implementation`:

* ``"grouped_mm"`` for bfloat16 on CUDA from compute capability 9.0: tokens sorted by expert on the device
  (``sort``, ``histc``, ``cumsum``: no host round trip), one grouped GEMM a projection whose groups are the
  experts hit; every selected expert's weights are read once a step, however many rows chose it;
* ``"batched_mm"`` everywhere else (float32 / float64, CPU, older GPUs): each (token, expert) pair gathers
  its expert's weights (``weight[expert_ids]``) and one batched product runs; on the device and exact, but an
  expert chosen by several rows is read (and copied) once per row;
* ``"rstitch_gemv"`` (:mod:`hf_rstitch.fast.kernels.expert_gemv`, the default on CUDA with Triton where every experts module has the
  layout its kernels cover): decode steps of up to ``expert_gemv.MAX_PAIRS`` (row, expert) pairs run two Triton
  kernels that read only the selected experts' weights; larger forwards run the dispatch above.

The routers of Qwen3-MoE, Mixtral and gpt-oss (linear, top-k, softmax) already stay on the device; those of
Qwen3-MoE's and Mixtral's form run two Triton kernels instead of six to eight PyTorch ones where Triton runs
(:mod:`.routers`); the lane installs them with the dispatch (:func:`experts_on`).

What it does not do: MoE blocks that do not dispatch through transformers' experts interface (their
loops read the routing on the host): :func:`why_not` names them, and the engine refuses them.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from .. import capabilities
from ..kernels import expert_gemv
from . import routers as moe_routers

# experts implementations that stay on the device: transformers' two, and ours for decode steps (..kernels.expert_gemv)
DISPATCHES = ("grouped_mm", "batched_mm", expert_gemv.NAME)
# config attributes that give a model experts (Qwen-MoE: num_experts, Mixtral / gpt-oss: num_local_experts)
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def expert_modules(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The modules that dispatch through transformers' experts interface (``@use_experts_implementation``)."""
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_transposed")
            and hasattr(getattr(m, "config", None), "_experts_implementation")]


def has_experts(model: PreTrainedModel) -> bool:
    text = model.config.get_text_config()
    return any((getattr(text, name, None) or 0) > 1 for name in EXPERT_COUNTS)


def why_not(model: PreTrainedModel) -> str | None:
    """Why the fast engine cannot run ``model``'s feed-forwards, in one line; None when it can (no experts, or
    experts that dispatch through transformers' experts interface)."""
    if has_experts(model) and not expert_modules(model):
        return (f"{type(model).__name__} has experts that do not dispatch through transformers' experts interface; "
                "the fast engine's graphs cannot hold their host-side routing")
    return None


def supports_moe(model: PreTrainedModel) -> bool:
    """The fast engine runs ``model``'s feed-forwards (dense, or experts it can keep on the device)."""
    return why_not(model) is None


def implementation(model: PreTrainedModel) -> str | None:
    """The experts implementation a lane runs ``model`` with (None: no experts to dispatch)."""
    if not expert_modules(model):
        return None
    device = model.device
    if device.type == "cuda" and expert_gemv.available(device) and model.dtype != torch.float64 and not any(
            expert_gemv.why_not(m) for m in expert_modules(model)):
        return expert_gemv.NAME
    fused = model.dtype == torch.bfloat16 and capabilities.has("grouped_mm", device)
    return "grouped_mm" if fused else "batched_mm"


class Plan(NamedTuple):
    kind: str | None  # the experts implementation (None: no experts)
    configs: tuple  # the configs the experts modules read it from
    routers: tuple = ()  # (router, forward) pairs running the router kernels (.routers)


def plan(model: PreTrainedModel, kind: str | None = None, routers: bool = True) -> Plan:
    """What a lane sets while it runs ``model``: ``kind`` (default :func:`implementation`) on its experts'
    configs, and with ``routers`` the router kernels' forwards where they run (:mod:`.routers`)."""
    modules = expert_modules(model)
    if kind is not None and kind not in DISPATCHES:
        raise ValueError(f"FastConfig.experts must be None or one of {DISPATCHES}, got {kind!r}")
    configs = {id(m.config): m.config for m in modules}
    kind = (kind or implementation(model)) if modules else None
    if kind == expert_gemv.NAME:
        expert_gemv.register()
    fused = tuple(moe_routers.plan(model)) if modules and routers else ()
    return Plan(kind, tuple(configs.values()), fused)


@contextlib.contextmanager
def experts_on(plan: Plan):
    """Dispatch the experts through ``plan.kind`` and the routers through their kernels inside the block (no
    experts: nothing changes).

    Only Python-side dispatch changes; a CUDA graph captured inside keeps the kernels it recorded.
    """
    configs = dict(enumerate(plan.configs)) if plan.kind is not None else {}
    kind = plan.kind
    before = {key: config._experts_implementation for key, config in configs.items()}
    patched = []
    try:
        for config in configs.values():
            config._experts_implementation = kind
        for router, forward in plan.routers:
            if "forward" not in router.__dict__:
                router.forward = forward
                patched.append(router)
        yield
    finally:
        for key, config in configs.items():
            config._experts_implementation = before[key]
        for router in patched:
            del router.forward
