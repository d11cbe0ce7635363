"""StepPolicy (step-level routing, GlimpRouter): hand values for the step-end matcher, then equivalence:
generate with the policy equals a cache-free reference of the rule, on the eager engine and the fast
engine's CPU static path, at batch size 1 (several architectures) and batched."""

import pytest
import torch

from hf_rstitch import StepPolicy
from hf_rstitch.core.entropy import normalized_entropy
from hf_rstitch.core.policies import StepView
from hf_rstitch.core.policies_step import StepEnds
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastEngine
from tiny_models import ARCHS, left_pad, make_pair, make_tokenizer, prompt

ENDS = list(range(1, 96, 2))  # odd ids end a step: steps of a few tokens
TAUS = (0.22, 0.25, 0.7)
N_NEW = 20
CPU = FastConfig(max_bucket=4, graphs=False)


def test_text_delimiter_across_tokens():
    tok = make_tokenizer()
    ends = StepEnds(". ", tok)  # a two-character delimiter, one character per token
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert ends([ids("ab. "), ids("ab."), ids(". x"), ids(" . ")]).tolist() == [True, False, False, True]


def test_step_ends_ids_and_missing_tokenizer():
    assert StepEnds(ids=[5]).__call__([[1, 5], [5, 1], []]).tolist() == [True, False, False]
    with pytest.raises(ValueError, match="tokenizer"):
        StepPolicy(0.1)


def test_rule_by_hand():
    """Step start -> the glimpse decides; inside a step the writer keeps it; the LLM returns at a step end."""
    p = StepPolicy(0.5, step_ends=[7])
    p.reset()
    logits = torch.zeros(2, 9)
    logits[0, 7], logits[1, 4] = 5.0, 5.0  # row 0's LLM token ends the step, row 1's does not
    first = StepView(0, torch.tensor([0.9, 0.1]), tokens=torch.tensor([[3], [3]]))
    assert p.hand_to_llm(first).tolist() == [True, False]
    mid = StepView(1, torch.tensor([0.1, 0.9]), tokens=torch.tensor([[3, 4], [3, 4]]))
    assert p.hand_to_llm(mid).tolist() == [True, False]  # no step start: owners keep their steps
    assert p.hand_to_slm(StepView(1, torch.tensor([0.9, 0.9]), logits=logits, tokens=mid.tokens)).tolist() == [True, True]
    start = StepView(2, torch.tensor([0.1, 0.9]), tokens=torch.tensor([[4, 7], [4, 7]]))
    assert p.hand_to_llm(start).tolist() == [False, True]


@torch.no_grad()
def _logits(model, seq):
    return model(input_ids=seq).logits[:, -1].double()


@torch.no_grad()
def reference_steps(llm, slm, ids, tau, ends, n_new, eos=1):
    """Cache-free greedy reference: at a step start the SLM's entropy picks the step's writer."""
    seq, roles, owner = ids, [], None
    for i in range(n_new):
        if owner is None:
            owner = Role.LLM if normalized_entropy(_logits(slm, seq)).item() > tau else Role.SLM
        token = _logits(llm if owner is Role.LLM else slm, seq).argmax(-1)
        seq, roles = torch.cat([seq, token[:, None]], dim=-1), roles + [owner]
        if token.item() in ends:
            owner = None
        if token.item() == eos:
            break
    return seq, roles


def _generate(llm, slm, ids, tau, engine, mask=None):
    return llm.generate(ids, attention_mask=mask if mask is not None else torch.ones_like(ids), assistant_model=slm,
                        stitch_policy=StepPolicy(tau, step_ends=ENDS), stitch_engine=engine, max_new_tokens=N_NEW,
                        do_sample=False, return_dict_in_generate=True)


def _traces(out):
    return out.stitch if isinstance(out.stitch, list) else [out.stitch]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_step_policy_equals_reference_on_both_engines(arch):
    llm, slm = make_pair(arch)
    ids = prompt(7, seed=4)
    mixed = 0
    for tau in TAUS:
        want, roles = reference_steps(llm, slm, ids, tau, set(ENDS), N_NEW)
        for engine in ("default", FastEngine(CPU)):
            out = _generate(llm, slm, ids, tau, engine)
            assert torch.equal(out.sequences, want)
            assert _traces(out)[0].roles == roles
        mixed += len(set(roles)) > 1
    assert mixed >= 1  # some threshold split the steps between the models


@pytest.mark.slow
def test_step_policy_batched_rows_equal_their_solo_runs():
    llm, slm = make_pair("llama")
    prompts = [prompt(k, seed=30 + k) for k in (5, 9, 3)]
    ids, mask = left_pad(prompts)
    for engine in ("default", FastEngine(CPU)):
        out = _generate(llm, slm, ids, 0.5, engine, mask)
        for row, p in enumerate(prompts):
            solo, roles = reference_steps(llm, slm, p, 0.5, set(ENDS), N_NEW)
            got = out.sequences[row, ids.shape[1]:ids.shape[1] + solo.shape[1] - p.shape[1]]
            assert torch.equal(got, solo[0, p.shape[1]:])
            assert _traces(out)[row].roles == roles


@pytest.mark.slow
def test_step_policy_in_the_request_engine_equals_solo_runs():
    """Rows joining a running batch start a step at their first token (PinnedRoles.start_rows)."""
    from hf_rstitch.batching.requests import Request, RequestEngine

    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, max_batch=2, policy=StepPolicy(0.5, step_ends=ENDS))
    prompts = [prompt(k, seed=40 + k) for k in (5, 9, 3, 7)]
    requests = [Request(p[0].tolist(), max_new_tokens=m) for p, m in zip(prompts, (6, 14, 10, 8))]
    done = engine.run(requests)
    for r, p in zip(requests, prompts):
        want, roles = reference_steps(llm, slm, p, 0.5, set(ENDS), r.max_new_tokens)
        assert done[r.request_id].tokens == want[0, p.shape[1]:].tolist()
        assert done[r.request_id].trace.roles == roles
