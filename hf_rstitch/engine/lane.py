"""A lane: one model and its own KV cache, advanced over a shared token sequence.

The lane remembers how many tokens of the sequence its cache already holds (``seen``).
:meth:`Lane.advance` runs the model over exactly the tokens it has not seen -- the whole
prompt the first time (prefill), the other model's tokens after a switch (partial
prefill, fused with producing the next token), or the single previous token (decode) --
and returns the logits of the last position. No token is ever read twice.

R-Stitch never needs to shrink a cache: a discarded SLM proposal is a prediction, not an
input, so it never enters the SLM's cache. The only state a lane keeps is ``seen``.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import DynamicCache, PreTrainedModel

from ..core.roles import Role
from ..core.trace import CallKind, ForwardCall


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Lane:
    """One model of the pair with its cache.

    Args:
        model: a causal LM.
        role: :class:`Role.SLM` or :class:`Role.LLM`.
        vocab: width of the shared vocabulary; logits are cut to it.
        timing: record device-synchronised wall seconds of every forward call.
    """

    def __init__(self, model: PreTrainedModel, role: Role, vocab: int, timing: bool = False):
        self.model = model
        self.role = role
        self.vocab = vocab
        self.timing = timing
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self.seen = 0  # tokens of the shared sequence already in self.cache
        params = inspect.signature(model.forward).parameters
        self._keep_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def advance(
        self, seq: torch.Tensor, mask: torch.Tensor, resumed: bool = False, want_hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, ForwardCall]:
        """Run the model over ``seq[:, seen:]`` and return the next-token logits.

        Args:
            seq: ``[B, T]`` the whole sequence so far (prompt + new tokens), any device.
            mask: ``[B, T]`` attention mask (0 on left padding).
            resumed: the other model wrote the latest token(s), so this call is a partial prefill.
            want_hidden: also return the last layer's hidden state at the last position.

        Returns:
            logits ``[B, vocab]`` float32 on ``seq``'s device, hidden ``[B, D]`` or None, and
            the :class:`ForwardCall` record of this call.
        """
        total = seq.shape[1]
        n_kv = self.seen
        if total <= n_kv:
            raise RuntimeError(f"{self.role} lane has already seen {n_kv} tokens; nothing new in a sequence of {total}")
        kind = CallKind.PREFILL if n_kv == 0 else (CallKind.RESUME if resumed else CallKind.DECODE)
        mask = mask.to(self.device)
        positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)  # [B, T]; 0 on left padding
        start = 0.0
        if self.timing:
            _sync(self.device)
            start = time.perf_counter()
        out = self.model(
            input_ids=seq[:, n_kv:].to(self.device),
            attention_mask=mask,
            position_ids=positions[:, n_kv:],
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=want_hidden,
            **self._keep_kwargs,
        )
        logits = out.logits[:, -1, : self.vocab].to(device=seq.device, dtype=torch.float32, copy=True)
        hidden = out.hidden_states[-1][:, -1, :] if want_hidden else None
        seconds = None
        if self.timing:
            _sync(self.device)
            seconds = time.perf_counter() - start
        self.seen = total
        return logits, hidden, ForwardCall(self.role, kind, total - n_kv, n_kv, seconds)
