"""The reversible ``generate`` patch: ``generate(..., assistant_model=slm, stitch_threshold=tau)``.

Only calls that ask for stitching (``stitch_threshold`` / ``stitch_policy`` / ``stitch_router``
as an argument or ``stitch_threshold`` on the generation config) are rerouted -- through
transformers' own ``custom_generate`` hook, so all of generate's preparation still runs. Every
other call, HF's assisted generation included, goes to the original ``generate`` untouched.

Where the dispatcher sits: ``GenerationMixin.generate`` is a stack of decorators
(``deprecate_kwarg``, ``torch.no_grad``) over the real function. The dispatcher goes *under*
that stack (the decorator layers are rebuilt around it), so the warnings those decorators emit
with ``stacklevel=2`` still point at the caller, not at this file. A stack that cannot be rebuilt
(a decorator that is not a closure over the function below it) gets the dispatcher on top.

State lives on the installed functions, not in this module: ``importlib.reload`` of this module
(IPython's autoreload) finds the installed dispatcher and neither breaks nor stacks it.
``unpatch()`` removes only its own layer: if another library wrapped ``generate`` afterwards,
the dispatcher stays in place but passes every call through until ``patch()`` is called again.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

_STITCH_ARGS = ("stitch_threshold", "stitch_policy", "stitch_router")
_MARK = "__rstitch_patch__"  # on the dispatcher: its state dict (active flag, installed top, original)


def _wants_stitching(model, kwargs: dict) -> bool:
    if any(kwargs.get(name) is not None for name in _STITCH_ARGS):
        return True
    config = kwargs.get("generation_config") or model.generation_config
    return getattr(config, "stitch_threshold", None) is not None


def _is_stitched_decode(custom: Any) -> bool:
    from .decode import stitched_decode  # loaded at the first call, not when generate is patched

    # by name too: after a reload of hf.decode a caller may hold the previous function object
    return custom is stitched_decode or (getattr(custom, "__qualname__", None) == "stitched_decode"
                                         and getattr(custom, "__module__", None) == stitched_decode.__module__)


def _make_dispatcher(inner: Callable) -> Callable:
    state: dict[str, Any] = {"active": True}

    @functools.wraps(inner)
    def generate(self, *args, **kwargs):
        custom = kwargs.get("custom_generate")
        if not state["active"] or not _wants_stitching(self, kwargs) or (
                custom is not None and not _is_stitched_decode(custom)):
            # another custom_generate (e.g. the exported Hub template) receives the stitch_* arguments itself
            return inner(self, *args, **kwargs)
        from .entry import run_stitched

        return run_stitched(inner, self, args, kwargs)

    state["dispatcher"] = generate
    generate.__dict__[_MARK] = state
    return generate


def _state_of(fn: Callable) -> dict[str, Any] | None:
    """The dispatcher's state if ``fn`` is (or wraps, through ``__wrapped__``) an installed dispatcher."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        state = getattr(fn, "__dict__", {}).get(_MARK)
        if state is not None and state.get("dispatcher") is fn:  # not a copy made by functools.wraps
            return state
        fn = getattr(fn, "__wrapped__", None)
    return None


def _rebuild(layer: Callable, old: Callable, new: Callable) -> Callable | None:
    """A copy of decorator function ``layer`` that calls ``new`` where it called ``old``; None if
    ``layer`` is not a plain closure over ``old``."""
    cells = getattr(layer, "__closure__", None) or ()
    hits = [i for i, c in enumerate(cells) if c.cell_contents is old]
    if not isinstance(layer, types.FunctionType) or len(hits) != 1:
        return None
    closure = tuple(types.CellType(new) if i == hits[0] else c for i, c in enumerate(cells))
    clone = types.FunctionType(layer.__code__, layer.__globals__, layer.__name__, layer.__defaults__, closure)
    clone.__kwdefaults__ = layer.__kwdefaults__
    for name in ("__module__", "__qualname__", "__doc__", "__annotations__"):
        setattr(clone, name, getattr(layer, name))
    clone.__dict__.update({**layer.__dict__, "__wrapped__": new})
    return clone


def _install(original: Callable) -> Callable:
    """``original``'s decorator layers rebuilt around a dispatcher over its innermost function."""
    chain = [original]
    while getattr(chain[-1], "__wrapped__", None) is not None and len(chain) < 32:
        chain.append(chain[-1].__wrapped__)
    dispatcher = _make_dispatcher(chain[-1])
    top = dispatcher
    for layer, below in zip(reversed(chain[:-1]), reversed(chain[1:])):
        top = _rebuild(layer, below, top)
        if top is None:
            dispatcher = top = _make_dispatcher(original)
            break
    dispatcher.__dict__[_MARK].update(top=top, original=original)
    return top


def _generation_mixin():
    # imported here, not at the top: importing it may run hf.deferred's pending patch, which imports this module
    from transformers.generation.utils import GenerationMixin

    return GenerationMixin


def patch() -> None:
    """Route stitching requests of ``GenerationMixin.generate`` to R-Stitch (idempotent)."""
    GenerationMixin = _generation_mixin()
    state = _state_of(GenerationMixin.generate)
    if state is not None:
        state["active"] = True
        return
    GenerationMixin.generate = _install(GenerationMixin.generate)


def unpatch() -> None:
    """Undo :func:`patch` (idempotent). Restores the previous ``generate`` if the patch is still
    the outermost layer; under another library's wrapper it only turns the dispatcher off."""
    GenerationMixin = _generation_mixin()
    state = _state_of(GenerationMixin.generate)
    if state is None:
        return
    state["active"] = False
    if GenerationMixin.generate is state["top"]:
        GenerationMixin.generate = state["original"]


def is_patched() -> bool:
    """Whether ``generate`` is patched now (after ``import hf_rstitch``: once transformers has loaded)."""
    GenerationMixin = _generation_mixin()
    state = _state_of(GenerationMixin.generate)
    return state is not None and state["active"]
