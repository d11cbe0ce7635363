"""Whether a fused kernel may stand in for a model's module: decided by behaviour, on random inputs, at plan time.

A kernel of :mod:`hf_rstitch.fast.kernels` replaces a module only where the module computes what the kernel
computes. Here each candidate module runs on seeded random inputs -- with its floating-point parameters replaced
by random ones, so a weight that happens to be all ones or zeros hides nothing -- next to the kernel's
arithmetic written in PyTorch (the same roundings as the kernel: :func:`rms_norm_reference`,
:func:`router_reference`), on the module's device and in its dtype. The answer is a :class:`Verdict`: equal or
not, the largest absolute difference, and a sentence for the plan ("probe equal (max abs err 0)", "probe differs
(max abs err 3.1e-02)", "probe failed: TypeError: ..."). :class:`~hf_rstitch.fast.plan.FastPlan` prints it per
module.

Equal means bit-equal in float32 and float64 (what the CPU equivalence tests compare), and within one unit in the
last place of the module's output in float16 / bfloat16 (another order of the same float32 sums rounds a last
bit otherwise). Inputs include rows whose mean square is of the order of the norm's epsilon, so a changed
epsilon shows at any precision.

The probes of whole decoder layers and attention layers (:mod:`hf_rstitch.fast.patches.add_norm`,
:mod:`hf_rstitch.fast.patches.folds`) use the same :class:`Verdict` and :func:`once`.

What it does not do: prove equality for every input (a probe is a few random rows); the kernels' own tests
(``tests/fast/kernels``) prove the kernels equal to the arithmetic written here.
"""

from __future__ import annotations

import copy
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

SEED = 0x5EED  # every probe draws from a generator of this seed: the same plan twice
ROWS = 4  # rows of a probe's input: two of unit scale, two of the norm's epsilon's scale


class Verdict(NamedTuple):
    """One probe's answer: ``same`` (the kernel may stand in), the largest absolute difference (None where the
    probe did not run to the end) and the reason, as the plan prints it."""

    same: bool
    err: float | None
    why: str


def equal(got, want) -> Verdict:
    """Compare ``got`` with ``want`` (tensors, or tuples of them): bit-equal in float32 / float64 and integers,
    within a last-place unit of ``want`` in float16 / bfloat16."""
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    if not isinstance(got, tuple) or len(got) != len(want):
        return Verdict(False, None, f"probe differs (returns {_shape_of(got)}, the kernel {_shape_of(want)})")
    worst, same = 0.0, True
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return Verdict(False, None, f"probe differs (returns {_shape_of(got)}, the kernel {_shape_of(want)})")
        diff = (g.double() - w.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if w.is_floating_point() and w.dtype in (torch.float16, torch.bfloat16):
            same &= bool((diff <= torch.finfo(w.dtype).eps * w.double().abs() + torch.finfo(w.dtype).tiny).all())
        else:
            same &= bool(torch.equal(g, w))
    return Verdict(same, worst, f"probe {'equal' if same else 'differs'} (max abs err {worst:.2g})")


def failed(err: BaseException) -> Verdict:
    """The verdict of a probe that raised: the module's own code runs."""
    text = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
    return Verdict(False, None, f"probe failed: {type(err).__name__}: {text}".rstrip(": "))


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def randn(*shape: int, like: torch.Tensor, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values of ``shape`` (drawn on the CPU, then moved) in ``like``'s dtype and device."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(like.device, like.dtype)


def run_with(m: torch.nn.Module, params: dict[str, torch.Tensor], *args):
    """``m``'s forward on ``args`` with its parameters ``params`` (by name, its own where absent): in a shallow copy,
    so the module is not touched and its hooks do not run."""
    clone = copy.copy(m)
    clone._parameters = {**m._parameters, **params}
    return type(m).forward(clone, *args)


def random_params(m: torch.nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random values for every floating-point parameter of ``m`` itself (centred on one, as a norm's weight), by
    name."""
    return {name: 1 + randn(*p.shape, like=p, gen=gen, scale=0.5)
            for name, p in m._parameters.items() if p is not None and p.is_floating_point()}


_VERDICTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def once(m: torch.nn.Module, kind: str, probe) -> Verdict:
    """``probe(m)`` for ``kind``, kept per module while its dtype and device stay (a lane and its plan ask several
    times: the plan, the patches that install the kernels)."""
    key = (kind, type(m), *_placed(m))
    found = _VERDICTS.setdefault(m, {})
    if key not in found:
        try:
            with torch.no_grad():
                found[key] = probe(m)
        except Exception as err:  # noqa: BLE001 - any failure of the module's code keeps the module's code
            found[key] = failed(err)
    return found[key]


def _placed(m: torch.nn.Module) -> tuple:
    p = next(m.parameters(), None)
    return (None, None) if p is None else (str(p.dtype), str(p.device))


def _shape_of(x) -> str:
    if isinstance(x, tuple):
        return "(" + ", ".join(_shape_of(v) for v in x) + ")"
    return f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


# ---- the kernels' arithmetic, in PyTorch ----------------------------------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """What :func:`hf_rstitch.fast.kernels.norms.rms_norm` computes: ``weight * (x * rsqrt(mean(x^2) + eps))``
    in float32, ``x * rstd`` rounded to ``x``'s dtype before the weight multiplies it."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(m: torch.nn.Module) -> Verdict:
    """Whether the RMSNorm kernel may stand in for ``m``: a 1-D ``weight``, a float ``variance_epsilon``, and the
    module's output on random rows (random weight) equal to :func:`rms_norm_reference`'s."""
    weight, eps = getattr(m, "weight", None), getattr(m, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return Verdict(False, None, "not an RMSNorm the kernel reads (a 1-D weight, a float variance_epsilon)")
    return once(m, "rms_norm", _rms_norm_probe)


def _rms_norm_probe(m: torch.nn.Module) -> Verdict:
    gen = generator()
    k = m.weight.shape[0]
    small = max(m.variance_epsilon, 1e-12) ** 0.5  # rows where the epsilon weighs as much as the mean square
    x = torch.cat([randn(2, k, like=m.weight, gen=gen), randn(ROWS - 2, k, like=m.weight, gen=gen, scale=small)])
    params = random_params(m, gen)
    got = run_with(m, params, x)
    return equal(got, rms_norm_reference(x, params.get("weight", m.weight), m.variance_epsilon))


def router_reference(x: torch.Tensor, weight: torch.Tensor, top_k: int, normalize: bool, float_weights: bool):
    """What :func:`hf_rstitch.fast.kernels.moe_router.route` returns: ``(logits, weights, ids)``; softmax in
    float32, the top-k, divided by their sum where ``normalize``, cast to the logits' dtype unless
    ``float_weights``."""
    logits = F.linear(x, weight)
    top, ids = torch.topk(F.softmax(logits, dtype=torch.float32, dim=-1), top_k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top if float_weights else top.to(logits.dtype), ids
