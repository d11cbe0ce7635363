"""Admission and preemption by KV blocks: the request engine's decisions over a paged cache (pure arithmetic).

With paged lanes (:mod:`hf_rstitch.fast.paged_kv`) a row holds the blocks of the tokens it has written: its
prompt and its output so far, in each lane (both lanes hold every column of every row). The engine keeps
the rows' need within the pool so that no lane call runs out of blocks:

* a step writes one column a row, and a run-ahead call (:mod:`.loop`) the next one, so a row with ``n``
  tokens needs blocks for ``n + 1`` (:meth:`KVBudget.need`);
* **admission**: waiting requests join, in order of arrival, while the running rows' needs, the joining
  prompts' needs and one block of headroom a row (each row's next block) fit the pool
  (:meth:`KVBudget.admit`); the first request into an empty batch needs no headroom;
* **preemption**: when the running rows outgrow the pool anyway (every row crossing into a new block at
  once), the newest rows leave the batch until the rest fit (:meth:`KVBudget.preempt`): the engine puts
  them back at the head of the queue with the tokens they have written (they resume with a prefill, as
  vLLM's recompute preemption does). A row that outgrows an empty pool alone cannot resume: it fails.

What it does not do: swap blocks to the host, or share prompt blocks between rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVBudget:
    """The blocks every lane's pool can hand out (the smallest lane's) and the tokens a block holds."""

    blocks: int
    block: int

    def need(self, tokens: int) -> int:
        """Blocks of a row holding ``tokens`` tokens, with the column its next call writes."""
        return -(-(tokens + 1) // self.block)

    def fits(self, tokens: int) -> bool:
        """A request of ``tokens`` prompt tokens fits an empty pool."""
        return self.need(tokens) <= self.blocks

    def admit(self, running: list[int], waiting: list[int]) -> int:
        """How many of the ``waiting`` prompts (token counts, in order) may join rows holding ``running`` tokens."""
        block = self.block
        used = sum((n + block) // block for n in running)  # need(n) for every running row, inlined (hundreds a step)
        rows = len(running)
        taken = 0
        for n in waiting:
            used += self.need(n)
            rows += 1
            headroom = rows if rows > 1 else 0
            if used + headroom > self.blocks:
                break
            taken += 1
        return taken

    def preempt(self, running: list[int]) -> tuple[list[int], list[int]]:
        """Rows to take out (indices into ``running``, newest last) so that the rest fit: ``(requeue, fail)`` --
        rows to requeue, and a row that does not fit even alone (it fails)."""
        block = self.block
        needs = [(n + block) // block for n in running]  # need(n), inlined
        used, out = sum(needs), []
        i = len(needs)
        while used > self.blocks and i > 1:
            i -= 1
            used -= needs[i]
            out.append(i)
        fail = [0] if used > self.blocks and needs else []
        return sorted(out), fail


def budget_of(lanes) -> KVBudget | None:
    """The budget of a pair of lanes whose caches are paged (their ``kv_pool``); None when any lane's cache is
    not (eager lanes grow without bound; static caches hold every row's capacity)."""
    pools = [getattr(lane, "kv_pool", None) for lane in lanes]
    if not pools or any(p is None for p in pools):
        return None
    return KVBudget(min(p.allocator.usable for p in pools), pools[0].block)
