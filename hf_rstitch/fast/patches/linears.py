"""Which linear layers of a model run the GEMV kernels of :mod:`hf_rstitch.fast.kernels.gemv`, fused how, with which configuration.

A lane asks once, when it is built (:func:`plan`, through :mod:`.products`): every plain ``nn.Linear`` the kernels
can read gets a forward that runs the tuned kernel for inputs of the tiers it was tuned for and ``F.linear`` for
longer ones; the q/k/v projections of an attention module run as one product over their concatenated weights
(:class:`FusedGroup`). :func:`gemv_linears_on` installs the forwards around each of the lane's calls. At one row a
layer may fold its norm or residual add into these products (:mod:`.folds`): the forwards take what it asks.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from . import folds
from ..kernels import gemv, shortlist
from ..kernels.gemv import DTYPES, MAX_ROWS, TIERS, GemvConfig, _reference, launch, shape_key, tier, tiers_for


def readable(m: torch.nn.Module) -> bool:
    """A plain ``nn.Linear`` in :data:`DTYPES` whose weight rows are contiguous: what the kernels read.
    Anything else (quantized or wrapped layers, float64) keeps its own forward."""
    return type(m) is torch.nn.Linear and m.weight.dtype in DTYPES and m.weight.stride(-1) == 1


def linear_modules(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's linear layers the kernels can read (decoder projections and the LM head)."""
    return [m for m in model.modules() if readable(m)]


def config_for(table: dict, weight: torch.Tensor, bias: torch.Tensor | None, block_m: int = 1) -> GemvConfig | None:
    """``table``'s configuration for this shape and tier (``block_m`` in :data:`TIERS`; None: cuBLAS),
    tuned on first sight."""
    key = shape_key(weight, bias, block_m)
    if key not in table:
        table[key] = gemv.tune(weight, bias, shortlist.candidates("gemv", block_m, gemv.TIER_CANDIDATES))
    return table[key]


def configs_for(table: dict, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int = MAX_ROWS) -> tuple:
    """One configuration per tier of :data:`TIERS` (None: cuBLAS) for the tiers :func:`tiers_for` tunes."""
    return tuple(config_for(table, weight, bias, top) if tuned else None
                 for top, tuned in zip(TIERS, tiers_for(max_rows)))


def tune_model(model: torch.nn.Module, table: dict | None = None, max_rows: int = MAX_ROWS) -> dict:
    """A configuration per distinct linear shape of ``model`` and tier up to ``max_rows`` (entries already in
    ``table`` are kept)."""
    table = {} if table is None else table
    for m in linear_modules(model):
        configs_for(table, m.weight, m.bias, max_rows)
    return table


def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfgs, norm=None,
          residual: torch.Tensor | None = None) -> torch.Tensor:
    """The tuned kernel for the input's rows (``cfgs``: a configuration per tier), else cuBLAS. One row may come
    with a fold (:mod:`.folds`): ``norm`` (weight, eps) before the product, ``residual`` added after."""
    t = tier(x.numel() // weight.shape[1])
    c = cfgs[t] if t is not None else None
    w, e = norm or (None, 0.0)
    if c is None:  # a long catch-up prefill, a tier not tuned, or cuBLAS measured faster for this shape
        return _reference(x, weight, bias, w, e, residual)
    return torch.ops.hf_rstitch.gemv(x, weight, bias, c.block_n, c.block_k, c.num_warps, c.num_stages, c.block_m,
                                     c.split_k, w, e, residual)


def _forward(module: torch.nn.Linear, cfgs, x: torch.Tensor) -> torch.Tensor:
    return _gemv(x, module.weight, module.bias, cfgs, residual=folds.residual_for(module))


folds.TAKES_ADD.add(_forward)
FUSED = ("q_proj", "k_proj", "v_proj")  # children of one attention module that read the same input


class FusedGroup:
    """Linear layers that read the same input, run as one product; each member returns its columns.

    The first member called with a new input computes the product over the concatenated weight
    (a copy: it does not follow later changes of the model's weights) and keeps it until every
    member has taken its slice. For Qwen2-7B the q/k/v projections (3584, 512 and 512 outputs)
    become one 4608-wide product (timed: ``benchmarks/results/gemv_*.md``).
    """

    def __init__(self, members: list[torch.nn.Linear], table: dict, max_rows: int = MAX_ROWS):
        self.members = members
        with torch.no_grad():
            self.weight = torch.cat([m.weight for m in members]).contiguous()
            self.bias = None
            if members[0].bias is not None:
                self.bias = torch.cat([m.bias for m in members]).contiguous()
        self.cfgs = configs_for(table, self.weight, self.bias, max_rows)
        self.bounds = [0]
        for m in members:
            self.bounds.append(self.bounds[-1] + m.out_features)
        self.x = self.out = None
        self.taken = 0

    @classmethod
    def fits(cls, members: list) -> bool:
        first = members[0]
        return all(readable(m) and m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
                   and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
                   for m in members)

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self.out is None or self.x is not x:
            self.x, self.out, self.taken = x, _gemv(x, self.weight, self.bias, self.cfgs, folds.norm_for(x)), 0
        part = self.out[..., self.bounds[index]:self.bounds[index + 1]]
        self.taken += 1
        if self.taken == len(self.members):  # every member served: drop the references
            self.x = self.out = None
        return part


folds.TAKES_NORM.add(FusedGroup.forward)


def fused_groups(model: torch.nn.Module) -> list[list[torch.nn.Linear]]:
    """The q/k/v projections (:data:`FUSED`) of each attention module that run as one product."""
    groups = []
    for parent in model.modules():
        members = [getattr(parent, name, None) for name in FUSED]
        if all(m is not None for m in members) and FusedGroup.fits(members):
            groups.append(members)
    return groups


def plan(model: torch.nn.Module, table: dict, fuse: bool = True,
         max_rows: int = MAX_ROWS) -> list[tuple[torch.nn.Linear, functools.partial]]:
    """The forwards to install for ``model``'s linear layers: fused q/k/v groups (``fuse``) and the
    tuned kernel for every other layer; tunes shapes missing from ``table`` for inputs of up to ``max_rows``
    rows (a lane's batch; catch-ups of up to :data:`MAX_ROWS` tokens always)."""
    patches, grouped = [], set()
    for members in fused_groups(model) if fuse else []:
        group = FusedGroup(members, table, max_rows)
        patches += [(m, functools.partial(group.forward, i)) for i, m in enumerate(members)]
        grouped.update(id(m) for m in members)
    for m in linear_modules(model):
        if id(m) not in grouped:
            patches.append((m, functools.partial(_forward, m, configs_for(table, m.weight, m.bias, max_rows))))
    return patches


def pending(model: torch.nn.Module, table: dict, fuse: bool = True, max_rows: int = MAX_ROWS,
            held: bool = False) -> list[tuple]:
    """``(candidates, run)`` for each shape and tier that :func:`plan` would tune (not in ``table``), for
    :func:`~hf_rstitch.fast.kernels.triton_support.precompile` to build every candidate's kernels at once; with
    ``held``, instead ``((choice,), run)`` for each shape and tier ``table`` already holds a kernel's configuration
    for (its kernel is built ahead too, not at its first capture). A fused group's weight stands in as one empty
    tensor of its shape (kernels compile for shapes, not values)."""
    groups = fused_groups(model) if fuse else []
    grouped = {id(m) for members in groups for m in members}
    products = [(m.weight, m.bias) for m in linear_modules(model) if id(m) not in grouped]
    shapes = {}
    for members in groups:  # one stand-in per distinct shape
        w, b = members[0].weight, members[0].bias
        n = sum(m.out_features for m in members)
        shapes.setdefault((n, w.shape[1], w.dtype, w.device, b is not None),
                          (w.new_empty(n, w.shape[1]), None if b is None else b.new_empty(n)))
    jobs, seen = [], set()
    for weight, bias in list(shapes.values()) + products:
        for top, tuned in zip(TIERS, tiers_for(max_rows)):
            key = shape_key(weight, bias, top)
            if tuned and key not in seen and (key in table) == held:
                seen.add(key)
                candidates = (shortlist.candidates("gemv", top, gemv.TIER_CANDIDATES) if not held
                              else tuple(c for c in (table[key],) if c is not None))
                x = weight.new_empty(top, weight.shape[1])
                jobs += [(candidates, functools.partial(launch, x, weight, bias))] if candidates else []
    return jobs


@contextlib.contextmanager
def gemv_linears_on(patches: list[tuple[torch.nn.Linear, functools.partial]]):
    """Inside the block, the linear layers of ``patches`` (from :func:`plan`) run the tuned kernels
    for inputs of the tiers they were tuned for and ``F.linear`` for longer ones.

    The plan is computed once: walking a model's modules on every call costs more host time
    than a decode step's launch. Only Python dispatch changes (an instance ``forward``); a CUDA
    graph captured inside keeps the kernels it recorded.
    """
    patched = []
    try:
        for m, fn in patches:
            if "forward" not in m.__dict__:
                m.forward = fn
                patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward
