"""A layer's residual adds and RMSNorms folded into the one-row products around them.

Why: at one row a pre-norm decoder layer (Llama, Qwen2, Mistral) runs six kernels around its attention with
``compile="parts"`` -- add+norm, q/k/v, (attention), o, add+norm, gated MLP, down -- and each costs a few
microseconds of launch and ramp while reading a few kilobytes. Here the norms run in the prologue of the
products that read them (each program of the q/k/v and gated kernels reduces the whole row, 3-7 KB from
L2, then normalizes the chunks it multiplies) and the adds in the epilogue of the products before them (o
and down add the residual to their rounded output): four kernels (measured:
``benchmarks/results/fold_bench_*.md``).

How: the layer forward of :mod:`.add_norm` decides, for a one-row call of a layer that :func:`foldable`
approved when the lane was built, what the next products must do, and says so through :func:`folding`:
"normalize this tensor with this norm before multiplying it" and "add this residual to that module's
output". The installed forwards of :mod:`.linears` and :mod:`.gated_mlp` take their part (:func:`norm_for`,
:func:`residual_for`); anything not taken by the end of the block is an error, never a silent skip.
Same arithmetic as the modules': the norm rounds ``x * rstd`` and the product with its weight to the model's
dtype, the add rounds the product before adding.

What it does not do: several rows (catch-ups and batches keep the add+norm pieces), norms whose probe differs
from Llama's RMSNorm (:mod:`hf_rstitch.fast.probes`), attention forwards whose probe shows them doing more than
project, attend and project (:func:`plain_attention`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect

import torch

from .. import probes
from ..kernels.norms import llama_rms_norm

ENABLED = True  # fold where foldable() allows; False keeps the add+norm pieces at one row too
# the installed forwards that take their part of a fold, declared by their modules (.linears, .gated_mlp):
TAKES_NORM: set = set()  # normalize their input first where the layer asked (norm_for)
TAKES_ADD: set = set()  # add the residual the layer asked for to their output (residual_for)


class _Pending:
    norm: tuple | None = None  # (x, norm weight, eps): the next product reading x normalizes it first
    add: tuple | None = None  # (module, residual): that module's output gets the residual added


_PENDING = _Pending()


def norm_for(x: torch.Tensor) -> tuple | None:
    """``(weight, eps)`` of the norm the layer asked for ``x``, taken (once), or None."""
    found = _PENDING.norm
    if found is None or found[0] is not x:
        return None
    _PENDING.norm = None
    return found[1], found[2]


def residual_for(module: torch.nn.Module) -> torch.Tensor | None:
    """The residual the layer asked to add to ``module``'s output, taken (once), or None."""
    found = _PENDING.add
    if found is None or found[0] is not module:
        return None
    _PENDING.add = None
    return found[1]


@contextlib.contextmanager
def folding(norm: tuple, add: tuple):
    """Within the block, the product that reads ``norm[0]`` normalizes it with ``norm[1]`` (an RMSNorm) and
    ``add[0]``'s output gets ``add[1]`` added. Both must be taken."""
    x, module = norm
    _PENDING.norm, _PENDING.add = (x, module.weight, module.variance_epsilon), add
    try:
        yield
        left = [what for what, pending in (("norm", _PENDING.norm), ("residual add", _PENDING.add)) if pending]
        if left:
            raise RuntimeError(f"the fast engine folded a {' and a '.join(left)} into products that did not run "
                               "it. Please report it; hf_rstitch.fast.patches.folds.ENABLED = False avoids it.")
    finally:
        _PENDING.norm = _PENDING.add = None


def _projects_plainly(attn) -> bool:
    """The attention forward feeds its input straight to the q/k/v projections and returns o's output as is
    (:func:`plain_attention`)."""
    return plain_attention(attn).same


def plain_attention(attn: torch.nn.Module) -> probes.Verdict:
    """Whether ``attn`` feeds its input straight to ``q_proj`` / ``k_proj`` / ``v_proj`` (once each) and returns
    ``o_proj``'s output as is: a probe runs its forward once on seeded random hidden states (a shallow copy whose
    projections note their inputs and outputs; rotation by angle zero, no mask, no cache)."""
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if not all(isinstance(getattr(attn, n, None), torch.nn.Linear) for n in names):
        return probes.Verdict(False, None, "no q_proj / k_proj / v_proj / o_proj linears")
    return probes.once(attn, "plain attention", _attention_probe)


class _Noted(torch.nn.Module):
    """A projection that notes the inputs it read and the outputs it gave."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear, self.inputs, self.outputs = linear, [], []

    def forward(self, x):
        self.inputs.append(x)
        self.outputs.append(type(self.linear).forward(self.linear, x))  # the linear's hooks do not run
        return self.outputs[-1]


def _attention_probe(attn: torch.nn.Module) -> probes.Verdict:
    w = attn.q_proj.weight
    x = probes.randn(1, 3, attn.q_proj.in_features, like=w, gen=probes.generator())
    head = getattr(attn, "head_dim", None) or 16
    angle = (torch.ones(1, 3, head, dtype=w.dtype, device=w.device), torch.zeros(1, 3, head, dtype=w.dtype,
                                                                                 device=w.device))
    noted = {n: _Noted(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    clone = copy.copy(attn)
    clone._modules = {**attn._modules, **noted}
    extra = {"position_ids": torch.arange(3, device=w.device)[None]}  # where the forward names them
    params = inspect.signature(type(attn).forward).parameters
    out = type(attn).forward(clone, hidden_states=x, position_embeddings=angle, attention_mask=None,
                             **{k: v for k, v in extra.items() if k in params})
    if not all(len(noted[n].inputs) == 1 and noted[n].inputs[0] is x for n in ("q_proj", "k_proj", "v_proj")):
        return probes.Verdict(False, None, "probe differs (q / k / v read other than the layer's input)")
    first = out[0] if isinstance(out, tuple) else out
    if len(noted["o_proj"].outputs) != 1 or first is not noted["o_proj"].outputs[0]:
        return probes.Verdict(False, None, "probe differs (returns other than o_proj's output)")
    return probes.Verdict(True, 0.0, "probe equal (projects its input, returns o_proj's output)")


def foldable(layer, products: dict) -> bool:
    """Whether a pre-norm ``layer`` (``add_norm.pre_norm_layer``) may fold at one row: both norms Llama's
    RMSNorm, a plain attention whose q/k/v run as one product of :mod:`hf_rstitch.fast.kernels.gemv`, and o, the gated MLP and down
    installed as the kernels that take a fold (:data:`TAKES_NORM`, :data:`TAKES_ADD`; ``products``: the lane's
    module -> installed forward)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    if not (ENABLED and attn is not None and mlp is not None and _projects_plainly(attn)
            and all(llama_rms_norm(n) for n in norms)):
        return False
    q_proj = getattr(attn, "q_proj", None)
    if not isinstance(q_proj, torch.nn.Linear) or any(n.weight.dtype != q_proj.weight.dtype for n in norms):
        return False  # a norm kept in another dtype gives its product another input dtype: not what we round to
    q, o, down = (products.get(getattr(m, name, None)) for m, name in
                  ((attn, "q_proj"), (attn, "o_proj"), (mlp, "down_proj")))
    fn = products.get(mlp)
    return (getattr(getattr(q, "func", None), "__func__", None) in TAKES_NORM  # a fused q/k/v group's method
            and all(getattr(p, "func", None) in TAKES_ADD for p in (o, down))
            and getattr(fn, "func", None) in TAKES_NORM)
