"""The R-Stitch+ router: a small MLP that reads the SLM's last hidden state and votes SLM or LLM.

Architecture (the paper's appendix, "Architecture and Overhead of Router"): an input
projection from the SLM hidden size to a narrow width, 6 residual FFN blocks with GELU, a final
LayerNorm and a two-way linear head whose logits are ordered ``(slm, llm)`` (:data:`ACTIONS`).
At the paper's sizes (hidden 3584, width 32) this is ~0.14M parameters; the paper reports 0.17M.

The router only scores states; when it is consulted (SLM steps above the entropy threshold)
is decided by :class:`hf_rstitch.router.policy.RouterPolicy`. It is saved and loaded the Hub way
(``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``) through huggingface_hub's
:class:`~huggingface_hub.PyTorchModelHubMixin`: ``config.json`` records the SLM hidden size and
the threshold the router was trained with.
"""

from __future__ import annotations

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from ..core.roles import Role

ACTIONS = (Role.SLM, Role.LLM)  # index 0 = keep the SLM's token, 1 = hand over to the LLM
SLM_ACTION, LLM_ACTION = 0, 1


class FFNBlock(nn.Module):
    """``x + W2 GELU(W1 LN(x))`` (pre-norm residual feed-forward)."""

    def __init__(self, width: int, expansion: int = 2):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, expansion * width)
        self.down = nn.Linear(expansion * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Router(nn.Module, PyTorchModelHubMixin, library_name="hf-rstitch", tags=["r-stitch", "router"]):
    """Scores ``(slm, llm)`` from SLM hidden states.

    Args:
        hidden_size: the SLM's hidden size (``slm.config.hidden_size``); checked at load time.
        width: residual stream width of the MLP.
        num_blocks: residual FFN blocks (the paper: 6).
        expansion: FFN inner width = ``expansion * width``.
        threshold: the entropy threshold tau the router was trained with (the default for
            ``generate(stitch_router=...)`` when no ``stitch_threshold`` is passed).
        llm_bias: initial bias of the ``llm`` logit; negative starts the router near "keep the SLM".
    """

    def __init__(self, hidden_size: int, width: int = 32, num_blocks: int = 6, expansion: int = 2,
                 threshold: float = 0.001, llm_bias: float = 0.0):
        super().__init__()
        if hidden_size <= 0 or width <= 0 or num_blocks < 0 or expansion <= 0:
            raise ValueError(f"Router sizes must be positive, got hidden_size={hidden_size}, width={width}, "
                             f"num_blocks={num_blocks}, expansion={expansion}.")
        self.hidden_size, self.threshold = int(hidden_size), float(threshold)
        self.input_norm = nn.LayerNorm(hidden_size)  # SLM hidden states are not normalised the same way
        self.proj = nn.Linear(hidden_size, width)
        self.blocks = nn.Sequential(*[FFNBlock(width, expansion) for _ in range(num_blocks)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(ACTIONS))
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.bias.copy_(torch.tensor([0.0, float(llm_bias)]))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [N, hidden_size]`` -> logits ``[N, 2]`` ordered ``(slm, llm)``."""
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(hidden_size_error(self.hidden_size, hidden.shape[-1]))
        x = self.proj(self.input_norm(hidden.to(self.head.weight.dtype)))
        return self.head(self.norm(self.blocks(x)))

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, 2]`` log pi(a | s) over ``(slm, llm)``."""
        return torch.log_softmax(self(hidden).float(), dim=-1)

    def check_slm(self, slm) -> None:
        """Raise if ``slm`` (a model or its config) has another hidden size than the router reads."""
        config = getattr(slm, "config", slm)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        got = getattr(config, "hidden_size", None)
        if got is not None and int(got) != self.hidden_size:
            raise ValueError(hidden_size_error(self.hidden_size, int(got)))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _router_from(source, flag: str = "router") -> Router:
    """``Router.from_pretrained`` with errors that name the argument (``flag``) and the fix."""
    from pathlib import Path

    from ..sources import check_router_source

    if not isinstance(source, (str, Path)):
        raise TypeError(f"a router must be a Router, a local folder or a Hub id (str or Path), got "
                        f"{type(source).__name__} {source!r}. For a ready policy object pass stitch_policy=.")
    if not str(source).strip():
        raise ValueError("the router path is empty; give the folder written by Router.save_pretrained "
                         "(rstitch train-router writes OUT/router) or a Hub id.")
    what = "a router saved with Router.save_pretrained (rstitch train-router writes OUT/router)"
    check_router_source(source, flag)  # a missing folder, or a Hub id neither cached nor on the Hub: at once
    try:
        import contextlib
        import io

        # huggingface_hub's mixin print()s "Loading weights from local directory"; stdout is for results
        with contextlib.redirect_stdout(io.StringIO()):
            return Router.from_pretrained(str(source))
    except (OSError, FileNotFoundError):
        raise
    except Exception as err:  # a corrupt or foreign file: safetensors / json / shape errors
        raise ValueError(f"cannot load a router from {source}: {type(err).__name__}: {err}. Expected {what}; "
                         "the files may be corrupt or belong to another model.") from None


def hidden_size_error(router_size: int, slm_size: int) -> str:
    return (f"router/SLM mismatch: the router reads hidden states of size {router_size}, but the SLM's hidden "
            f"size is {slm_size}. A router is trained for one SLM; load the router trained for this SLM, or train "
            "one with `rstitch train-router --slm ...`.")


def load_router(source, slm=None, device=None, flag: str = "router") -> Router:
    """A :class:`Router` from an object, a local folder, a Hub id or ``"shipped"`` (the router trained for the
    shipped pair, :func:`hf_rstitch.shipped`); checked against ``slm`` if given. ``flag`` names the argument in
    errors (``stitch_router``, ``--router``)."""
    if isinstance(source, str) and source in ("shipped", "shipped:router"):
        from ..resources import shipped

        source = shipped("router")
    router = source if isinstance(source, Router) else _router_from(source, flag)
    if slm is not None:
        router.check_slm(slm)
        device = device or next(slm.parameters()).device
    if device is not None:
        router = router.to(device)
    return router.eval()
