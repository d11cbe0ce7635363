"""Train an R2R-style router for the shipped toy pair and save it in R2R's published format.

R2R (thu-nics/R2R) labels the positions where the SLM's next token differs from the LLM's on the LLM's
responses, keeps the differences that change the outcome ("divergent", checked by LLM continuations), and
trains its router (hidden state, top-100 logits, token embedding) with BCE; the threshold is the largest
one that still recalls 95% of the positives. This script departs from it in two ways, to fit the toy pair
in a few CPU minutes: the contexts are the SLM's own greedy answers (the contexts the router judges at run
time), and every next-token disagreement with the LLM is a positive (no continuation check: every
difference in a toy-world digit changes the answer). No R2R router is published for this pair.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/r2r_toy_router.py --out runs/r2r_toy/router.pt
"""

from __future__ import annotations

import argparse

import torch


@torch.no_grad()
def examples(llm, slm, tok, rows, max_new: int = 200):
    """(hidden [N, H], logits [N, V], label [N]) over the SLM's answers: label = the LLM's argmax differs."""
    from hf_rstitch.eval.data import prompt_ids

    hs, zs, ys = [], [], []
    for row in rows:
        ids = torch.tensor([prompt_ids(tok, row["problem"], "", True)])
        seq = slm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
        out = slm(input_ids=seq, output_hidden_states=True)
        llm_next = llm(input_ids=seq).logits[0].argmax(-1)
        span = slice(ids.shape[1] - 1, seq.shape[1] - 1)  # positions that predict the answer's tokens
        hs.append(out.hidden_states[-1][0, span])
        zs.append(out.logits[0, span])
        ys.append((out.logits[0, span].argmax(-1) != llm_next[span]).float())
    return torch.cat(hs), torch.cat(zs), torch.cat(ys)


def train(router, data, epochs: int, lr: float = 1e-3, batch: int = 256, seed: int = 0) -> None:
    hidden, logits, label = data
    token, top = logits.argmax(-1), torch.topk(logits, router.logits_size, dim=-1).values
    pos = float(label.mean())
    loss_fn = torch.nn.BCELoss(reduction="none")
    opt = torch.optim.AdamW([p for p in router.parameters() if p.requires_grad], lr=lr, weight_decay=5e-4)
    g = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        order, total = torch.randperm(len(label), generator=g), 0.0
        for i in range(0, len(label), batch):
            j = order[i:i + batch]
            p = router(hidden[j], token[j], top[j])
            w = torch.where(label[j] > 0, 0.5 / max(pos, 1e-3), 0.5 / max(1 - pos, 1e-3))  # balanced classes
            loss = (w * loss_fn(p, label[j])).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(j)
        print(f"epoch {epoch}: loss {total / len(label):.4f}", flush=True)


@torch.no_grad()
def recall_threshold(router, data, recall: float) -> float:
    """The largest threshold whose decisions recall ``recall`` of the positives (R2R's choice)."""
    hidden, logits, label = data
    p = router(hidden, logits.argmax(-1), torch.topk(logits, router.logits_size, dim=-1).values)
    positives = p[label > 0].sort(descending=True).values
    return float(positives[min(len(positives) - 1, int(recall * len(positives)))]) if len(positives) else 0.5


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rstitch.resources import shipped
    from hf_rstitch.router.r2r import R2RRouter, save_r2r
    from hf_rstitch.toyworld.tasks import make_split

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/r2r_toy/router.pt")
    ap.add_argument("--n-train", type=int, default=300)
    ap.add_argument("--n-valid", type=int, default=80)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--recall", type=float, default=0.95)
    args = ap.parse_args()
    torch.manual_seed(0)
    llm = AutoModelForCausalLM.from_pretrained(shipped("llm")).eval()
    slm = AutoModelForCausalLM.from_pretrained(shipped("slm")).eval()
    tok = AutoTokenizer.from_pretrained(shipped("llm"))
    train_set = examples(llm, slm, tok, make_split("train", args.n_train, seed=7))
    valid_set = examples(llm, slm, tok, make_split("valid", args.n_valid, seed=7))
    print(f"{len(train_set[2])} train positions, {float(train_set[2].mean()):.3f} positive", flush=True)
    embed = slm.get_input_embeddings().weight.detach()
    router = R2RRouter(slm.config.hidden_size, embed, logits_size=min(100, embed.shape[0]), widths=[64, 64, 64])
    train(router, train_set, args.epochs)
    router.eval()
    router.threshold = recall_threshold(router, valid_set, args.recall)
    print(f"threshold for {args.recall:.0%} recall on valid: {router.threshold:.4f}", flush=True)
    print("saved", save_r2r(router, args.out, str(shipped("slm"))))


if __name__ == "__main__":
    main()
