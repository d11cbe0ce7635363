"""Compile only the parts that pay: the elementwise chains of a decoder layer (``FastConfig(compile="parts")``).

Why: in a CUDA graph of eager kernels a decode step of Qwen2 still runs ~40 kernels a layer, most
of them elementwise (RMSNorm: cast, square, mean, rsqrt, two products; the rotary embedding:
slices, negation, concatenation, products and sums for q and k; the gated activation), each a
few microseconds of launch and a round trip through memory. Compiling the whole step fuses them
but takes a static compile per (model, batch bucket, length) shape -- 30-40 s each for the 7B.
Here three small functions are compiled once per process with symbolic shapes, whatever the model
size, batch or length: the model's own RMSNorm ``forward``, its ``apply_rotary_pos_emb`` and the
SiLU-gated product of its MLP. Each becomes one or two fused kernels, recorded in the graphs.

A piece torch.compile cannot compile (a compiler bug of the installed torch) runs its eager code instead, the
reason logged once (:data:`EAGER`); the other pieces stay compiled and the graphs are captured as before.

Where the piece computes Llama's RMSNorm (its probe agrees: :mod:`hf_rstitch.fast.probes`; its add + norm) or is
the SiLU gate and Triton runs, a hand-written kernel (:mod:`hf_rstitch.fast.kernels.norms`, :data:`KERNELS`) takes
the compiled piece's place: no dynamo tracing for those models.

What it does not do: fuse across those pieces (residual adds stay eager kernels), or patch
anything whose shape it does not recognise (models without ``*RMSNorm`` modules, a module-level
``apply_rotary_pos_emb`` or a ``gate_proj / up_proj / down_proj`` MLP with SiLU keep their code).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.nn.functional as F
import torch.fx.experimental._config as fx_config

from .add_norm import plan as add_norm_plan
from ..kernels.norms import llama_rms_norm
from .gated_mlp import silu_mlp
from ..kernels import norms
from ..kernels.rotary_modules import rotary_functions

_COMPILED: dict = {}  # one compiled function per piece (and norm class), shared by every lane of the process
EAGER: dict = {}  # pieces torch.compile failed on -> the reason; they run their eager code (see _compiled)
log = logging.getLogger("hf_rstitch.fast")
# Llama's RMSNorm, its residual add + norm and the SiLU gate as hand-written Triton kernels (.norms) instead of
# compiled pieces where they reproduce the module (no dynamo tracing in the process for those models); False:
# every piece compiled
KERNELS = True

# Symbolic shapes still specialise a size seen as 1 (batch 1, one-token steps) and equate sizes that were
# equal at the first call ("duck sizing"), so a lane would compile each piece again at its first batch > 1.
# Size-oblivious sizes without duck sizing: one compile per piece.
_ONE_COMPILE = {k: v for k, v in (("backed_size_oblivious", True), ("use_duck_shape", False))
                if hasattr(fx_config, k)}


def _compile_errors() -> tuple:
    """The exceptions torch.compile raises when it cannot compile a function (not errors of the function)."""
    from torch._dynamo import exc

    found = [getattr(exc, "BackendCompilerFailed", None), getattr(exc, "Unsupported", None)]
    try:
        from torch._inductor.exc import InductorError
        found.append(InductorError)
    except ImportError:
        pass
    return tuple(e for e in found if e is not None)


def _compiled(key, fn):
    """``fn`` compiled once per process with symbolic shapes; where torch.compile cannot compile it (a compiler bug
    of this torch, e.g. torch 2.11's ``KeyError: 'unbacked_bindings'`` lowering a ``repeat_interleave`` under
    symbolic sizes: GLM / Cohere rotary functions), the piece runs ``fn`` eagerly from then on, said once.
    ``torch.compile`` is called at the piece's first call, not before: where hand-written kernels take every
    piece's place (:data:`KERNELS`) the process never pays its set-up (~0.3-0.6 s, the first in a process)."""
    if key not in _COMPILED:
        compiled = None

        @functools.wraps(fn)
        def call(*args, **kwargs):
            nonlocal compiled
            if key not in EAGER:
                compiled = compiled or torch.compile(fn, dynamic=True, fullgraph=True)
                with fx_config.patch(_ONE_COMPILE):
                    try:
                        return compiled(*args, **kwargs)
                    except _compile_errors() as err:
                        text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
                        EAGER[key] = f"{type(err).__name__}: {text}"
                        log.warning("hf_rstitch: compile='parts' runs %s eagerly: torch.compile failed on it (%s)",
                                    getattr(fn, "__qualname__", fn), EAGER[key])
            return fn(*args, **kwargs)

        _COMPILED[key] = call
    return _COMPILED[key]


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def silu_mul() -> "callable":
    """``silu(gate) * up`` as one kernel, any shape: the hand-written one (:mod:`hf_rstitch.fast.kernels.norms`,
    with :data:`KERNELS`) where it runs, else the compiled one (shared by every lane of the process)."""
    compiled = _compiled("silu_mul", _silu_mul)
    return norms.silu_mul_piece(compiled) if KERNELS else compiled


def _mlp_forward(mlp, act_mul, x: torch.Tensor) -> torch.Tensor:
    return mlp.down_proj(act_mul(mlp.gate_proj(x), mlp.up_proj(x)))


def plan(model: torch.nn.Module, keep_rotary=(), add_norm: bool = False, products=(),
         fold: bool = True) -> tuple[list, list]:
    """``(instance forwards to install, module globals to swap)`` for ``model``'s norms, MLPs and rotary
    embedding (but not the ``apply_rotary_pos_emb`` of the modelling modules in ``keep_rotary``); with
    ``add_norm``, pre-norm decoder layers run each residual add and the norm after it as one piece
    (:mod:`hf_rstitch.fast.patches.add_norm`), or at one row inside the lane's ``products`` (:mod:`.folds`)."""
    forwards = add_norm_plan(model, _pieces, products, fold) if add_norm else []
    for m in model.modules():
        cls = type(m)
        if norm_candidate(m):
            compiled = functools.partial(_compiled(("norm", cls), cls.forward), m)
            kernel = KERNELS and llama_rms_norm(m)
            forwards.append((m, functools.partial(norms.norm_forward, m, compiled) if kernel else compiled))
        elif cls.__name__.endswith("MLP") and silu_mlp(m):
            forwards.append((m, functools.partial(_mlp_forward, m, silu_mul())))
    globals_ = [(module, "apply_rotary_pos_emb", _compiled(("rotary", fn), fn))
                for module, fn in rotary_functions(model) if module not in keep_rotary]
    return forwards, globals_


def norm_candidate(m: torch.nn.Module) -> bool:
    """A norm this module compiles (or, where its probe agrees, runs as the RMSNorm kernel): a ``*RMSNorm`` class
    with its own forward."""
    return type(m).__name__.endswith("RMSNorm") and "forward" in type(m).__dict__


def _pieces(key, fn):
    """The piece ``key`` of :mod:`.add_norm`: the hand-written kernel where it applies (:data:`KERNELS`), else
    compiled."""
    compiled = _compiled(key, fn)
    return norms.add_norm_piece(compiled) if KERNELS and key[0] == "add_norm" else compiled


@contextlib.contextmanager
def regions_on(planned: tuple[list, list] | None):
    """Inside the block the planned modules run their compiled pieces (nothing when ``planned`` is None)."""
    if not planned:
        yield
        return
    forwards, globals_ = planned
    patched, swapped = [], []
    try:
        for m, fn in forwards:
            if "forward" not in m.__dict__:
                m.forward = fn
                patched.append(m)
        for module, name, fn in globals_:
            swapped.append((module, name, getattr(module, name)))
            setattr(module, name, fn)
        yield
    finally:
        for m in patched:
            del m.forward
        for module, name, fn in swapped:
            setattr(module, name, fn)
