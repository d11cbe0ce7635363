"""A slow reference for stitched decoding: every step recomputes each model's logits from the
full sequence without any cache, then applies the same rule. Greedy only."""

from __future__ import annotations

import torch

from hf_rstitch.core.entropy import normalized_entropy
from hf_rstitch.core.roles import Role


@torch.no_grad()
def _last_logits(model, seq, vocab):
    return model(input_ids=seq).logits[:, -1, :vocab].float()


@torch.no_grad()
def reference_stitch(llm, slm, input_ids, tau, max_new_tokens, eos_token_id=1):
    vocab = min(llm.get_output_embeddings().weight.shape[0], slm.get_output_embeddings().weight.shape[0])
    seq, roles, active = input_ids, [], Role.SLM
    for _ in range(max_new_tokens):
        if active is Role.SLM:
            logits = _last_logits(slm, seq, vocab).double()
            if normalized_entropy(logits).item() > tau:
                active = Role.LLM
        writer = active
        if writer is Role.LLM:
            logits = _last_logits(llm, seq, vocab).double()
            if normalized_entropy(logits).item() <= tau:
                active = Role.SLM
        token = logits.argmax(-1)
        seq = torch.cat([seq, token[:, None]], dim=-1)
        roles.append(writer)
        if token.item() == eos_token_id:
            break
    return seq, roles
