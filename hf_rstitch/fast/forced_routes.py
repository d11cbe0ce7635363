"""Entropies that follow a recorded route, so that the real policies decide it (speed measurements).

A random-weight model's entropies are meaningless, so the speed benchmarks used to replay a route
(:class:`~hf_rstitch.core.policies.ReplayPolicy`), skipping the policy a user's call runs. Here the model itself
is made to produce the route: :class:`ForcedEntropies` hooks a model's forward so that the next-token
distribution at each position of each row has the entropy the route asks for, and
:class:`~hf_rstitch.core.policies.EntropyPolicy` (or the router policy, whose rule is the same on the entropy
side) then reproduces the route decision by decision (:func:`high_entropy`).

How: a pre-hook on the model's forward notes the position ids of the columns whose logits it keeps
(``logits_to_keep``); a hook on the output embedding (the LM head) replaces those columns' logits, computed as
usual, by ``logits * 0`` plus one spike at a token drawn per (row, position): a spike of :data:`HIGH` leaves the
distribution near uniform (normalized entropy ~0.99 on a vocabulary of 100 or more), one of :data:`LOW` makes it
one-hot (~1e-12). Every op is a device op on tables filled before the call (:meth:`ForcedEntropies.follow`), so
the fast engine's CUDA graphs record the hook with the step and replay it. Positions before the first new
token's logits are left alone (the lanes' build-time probes see the model's own logits); positions past a
route's end repeat its last entry, as :class:`ReplayPolicy` does.

What it does not do: rows are the forward's batch rows, in order (no row may leave the batch early: generate
with no end token); the token each model writes is the spike's, the same for both models, so a route's tokens
do not depend on who wrote them. The hook adds a few small kernels a forward (index look-ups, a product, a
scatter): measure a replay on the same forced models to compare with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.roles import Role

HIGH = 2.0  # spike logit of a position whose distribution must be uncertain: normalized entropy ~0.99
LOW = 40.0  # spike logit of a confident position: normalized entropy ~1e-12


def high_entropy(route: Sequence[Role | str], role: Role | str) -> list[bool]:
    """Per new token ``i`` of ``route``, whether ``role``'s distribution for it must be uncertain (entropy above
    any threshold in (0, 0.99)) for the entropy rule (R-Stitch, Algorithm 1) to reproduce the route:

    * the SLM's, when token ``i`` is the LLM's (the SLM hands the position over; where the LLM holds control the
      SLM is not asked);
    * the LLM's, when token ``i + 1`` is the LLM's too (it keeps control; past the route's end, its last entry).
    """
    llm = [Role(r) is Role.LLM for r in route]
    if Role(role) is Role.SLM:
        return llm
    return [llm[min(i + 1, len(llm) - 1)] for i in range(len(llm))]


class ForcedEntropies:
    """Hooks ``model`` so that its entropies follow routes (see the module docstring); :meth:`close` removes them.

    Args:
        model: a causal LM whose forward takes ``position_ids`` (the lanes of both engines pass them).
        role: the model's role in the pair (:func:`high_entropy`).
        rows: most rows of a forward (a fast lane's largest batch bucket).
        positions: longest sequence, prompt included.
        vocab: the spike tokens are drawn below it (the pair's shared vocabulary).
        seed: seed of the spike tokens (the same seed and vocabulary give both models the same tokens).
    """

    def __init__(self, model, role: Role | str, rows: int, positions: int, vocab: int, seed: int = 0):
        head = model.get_output_embeddings()
        device, dtype = head.weight.device, head.weight.dtype
        self.role, self.rows, self.positions = Role(role), rows, positions
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (rows * positions,), generator=g).to(device)  # [R * P]
        self.table = torch.zeros(rows * positions, 2, dtype=dtype, device=device)  # (factor, spike) a position
        self.table[:, 0] = 1  # nothing forced until follow()
        self.offsets = torch.arange(rows, device=device) * positions  # [R] first entry of each row
        self._at: torch.Tensor | None = None  # [b, k] positions of the kept columns, set by the pre-hook
        self._hooks = [model.register_forward_pre_hook(self._note_positions, with_kwargs=True),
                       head.register_forward_hook(self._force)]

    def follow(self, routes: Sequence[Sequence[Role | str]], prompt: int | Sequence[int]) -> None:
        """Force the routes from now on: ``routes`` one per row (or one for every row), ``prompt`` each row's
        prompt length in real tokens (new token ``i`` of a row comes from the logits at position ``prompt + i - 1``).
        Rows past the routes follow the last one."""
        routes = [routes] if routes and isinstance(routes[0], (str, Role)) else list(routes)
        prompts = [prompt] * len(routes) if isinstance(prompt, int) else list(prompt)
        if not routes or len(prompts) != len(routes) or len(routes) > self.rows:
            raise ValueError(f"ForcedEntropies.follow needs 1 to {self.rows} routes and a prompt length for each, got "
                             f"{len(routes)} routes and {len(prompts)} prompt lengths.")
        table = torch.empty(self.rows, self.positions, 2)
        at = torch.arange(self.positions)
        for r in range(self.rows):
            route, first = routes[min(r, len(routes) - 1)], prompts[min(r, len(routes) - 1)] - 1
            high = torch.tensor(high_entropy(route, self.role))
            i = at - first  # new token each position's logits decide; < 0: a prompt position, left alone
            spike = torch.where(high[i.clamp(0, len(route) - 1)], HIGH, LOW)
            table[r, :, 0] = (i < 0).float()
            table[r, :, 1] = torch.where(i < 0, 0.0, spike)
        self.table.copy_(table.view(-1, 2))

    def close(self) -> None:
        """Remove the hooks (graphs captured meanwhile keep what they recorded)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _note_positions(self, module, args, kwargs) -> None:
        pos, keep = kwargs.get("position_ids"), kwargs.get("logits_to_keep", 0)
        if pos is None:  # a caller that does not say where it is: its logits are left alone
            self._at = None
        elif isinstance(keep, torch.Tensor):
            self._at = pos.index_select(1, keep.reshape(-1))
        else:
            self._at = pos[:, -keep:] if keep else pos

    def _force(self, module, args, logits: torch.Tensor) -> torch.Tensor | None:
        at, self._at = self._at, None
        if at is None:
            return None
        b, vocab = logits.shape[0], logits.shape[-1]
        if b > self.rows:
            raise ValueError(f"ForcedEntropies was built for {self.rows} rows but a forward runs {b}; build it with "
                             f"rows >= the largest batch (bucket) the lanes run.")
        flat = logits.reshape(b, -1, vocab)  # [b, k, V]: the kept columns
        k = flat.shape[1]
        index = (self.offsets[:b, None] + at.expand(b, k).clamp(0, self.positions - 1)).reshape(-1)  # [b * k]
        got = self.table.index_select(0, index).view(b, k, 2).to(logits.dtype)
        out = flat * got[..., :1]  # the product stays: a forward reads its LM head as before
        out.scatter_add_(-1, self.tokens.index_select(0, index).view(b, k, 1), got[..., 1:])
        return out.view(logits.shape)
