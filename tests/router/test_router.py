"""Router module, Hub-style save/load, RouterPolicy semantics and the generate glue."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role, StepView
from hf_rstitch.router import Router, RouterPolicy, assign_rows
from hf_rstitch.router.model import LLM_ACTION, SLM_ACTION
from tiny_models import make_pair, prompt


class Constant(Router):
    """A router that always votes one way (for semantics tests)."""

    def __init__(self, hidden_size: int, vote: int):
        super().__init__(hidden_size, width=4, num_blocks=1)
        self.vote = vote

    def forward(self, hidden):
        out = torch.full((hidden.shape[0], 2), -10.0)
        out[:, self.vote] = 10.0
        return out


def test_shapes_and_parameter_count():
    r = Router(hidden_size=48, width=8, num_blocks=6)
    assert r(torch.randn(5, 48)).shape == (5, 2)
    blocks = 6 * (2 * 8 + 8 * 16 + 16 + 16 * 8 + 8)  # LayerNorm + up + down per block
    expected = 2 * 48 + (48 * 8 + 8) + blocks + 2 * 8 + (8 * 2 + 2)
    assert r.num_parameters() == expected
    # the paper's size: SLM hidden 3584, ~0.17M parameters (ours: 0.14M at width 32)
    assert 1.0e5 < Router(3584, width=32).num_parameters() < 2.0e5


def test_save_load_round_trip(tmp_path):
    r = Router(hidden_size=32, width=8, num_blocks=2, threshold=0.05)
    r.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
    loaded = Router.from_pretrained(str(tmp_path))
    assert loaded.hidden_size == 32 and loaded.threshold == 0.05
    x = torch.randn(3, 32)
    assert torch.equal(loaded(x), r(x))


def test_hidden_size_mismatch_is_a_clear_error(tmp_path):
    _, slm = make_pair("llama")  # SLM hidden size 32
    Router(hidden_size=48).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="hidden states of size 48.*hidden size is 32"):
        hf_rstitch.router.load_router(str(tmp_path), slm=slm)
    with pytest.raises(ValueError, match="size 48"):
        Router(48)(torch.randn(2, 32))


def test_low_entropy_rows_never_reach_the_router():
    calls = []
    router = Constant(4, LLM_ACTION)
    router.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    policy = RouterPolicy(router, threshold=0.3)
    step = StepView(0, torch.tensor([0.1, 0.5, 0.3, 0.9]), torch.randn(4, 4))
    assert policy.hand_to_llm(step).tolist() == [False, True, False, True]
    assert calls == [2]  # only the two rows above tau
    assert not policy.hand_to_llm(StepView(1, torch.tensor([0.0, 0.2, 0.1, 0.3]), torch.randn(4, 4))).any()
    assert calls == [2]
    # LLM steps follow the entropy rule
    assert policy.hand_to_slm(StepView(2, torch.tensor([0.3, 0.31]))).tolist() == [True, False]


def test_device_decisions_equal_the_host_ones():
    """On a GPU the router scores every row as device ops (nothing read back); its decisions equal the host path's,
    which scores only the rows above tau."""
    torch.manual_seed(0)
    router = Router(16, width=8, num_blocks=2).double().eval()
    policy = RouterPolicy(router, threshold=0.5)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        step = StepView(seed, torch.rand(64, generator=g, dtype=torch.float64),
                        torch.randn(64, 16, generator=g, dtype=torch.float64))
        host = policy.hand_to_llm(step)
        device = policy._on_device(step, step.entropy > policy.threshold)
        assert torch.equal(device, host) and host.any() and not host.all()


def test_router_slm_vote_keeps_the_slm():
    llm, slm = make_pair("llama")
    ids = prompt()
    keep = llm.generate(ids, assistant_model=slm, stitch_policy=RouterPolicy(Constant(32, SLM_ACTION), 0.0),
                        max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert set(keep.stitch.roles) == {Role.SLM}
    assert torch.equal(keep.sequences, slm.generate(ids, max_new_tokens=12, do_sample=False))
    hand = llm.generate(ids, assistant_model=slm, stitch_policy=RouterPolicy(Constant(32, LLM_ACTION), 0.0),
                        max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert hand.stitch.llm_tokens > 0 and any(hand.stitch.handovers)


def test_sampling_records_log_probs_per_row():
    llm, slm = make_pair("llama")
    router = Router(32, width=8, num_blocks=2)
    ids = torch.cat([prompt(7, seed=1)] * 3)
    policy = RouterPolicy(router, 0.2, sample=True, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    out = llm.generate(ids, assistant_model=slm, stitch_policy=policy, max_new_tokens=15, do_sample=True,
                       return_dict_in_generate=True)
    rows = assign_rows(policy.consults, out.stitch)
    assert len(rows) == 3 and sum(len(r) for r in rows) > 0
    for trace, dec in zip(out.stitch, rows):
        consulted = [i for i, h in enumerate(trace.slm_entropies) if h is not None and h > 0.2]
        assert dec.steps.tolist() == consulted  # one decision per uncertain SLM step, none elsewhere
        assert [trace.handovers[i] for i in consulted] == (dec.actions == LLM_ACTION).tolist()
        expected = router.log_probs(dec.hidden).gather(1, dec.actions[:, None]).squeeze(1)
        assert torch.allclose(dec.logp, expected, atol=1e-6)


def test_generate_stitch_router_argument(tmp_path):
    llm, slm = make_pair("llama")
    router = Router(32, width=8, num_blocks=2, threshold=0.3)
    router.save_pretrained(tmp_path)
    ids = prompt()
    by_path = llm.generate(ids, assistant_model=slm, stitch_router=str(tmp_path), max_new_tokens=10,
                           return_dict_in_generate=True)
    by_policy = llm.generate(ids, assistant_model=slm, stitch_policy=RouterPolicy(router, 0.3), max_new_tokens=10,
                             return_dict_in_generate=True)
    assert torch.equal(by_path.sequences, by_policy.sequences)
    assert by_path.stitch.roles == by_policy.stitch.roles and by_path.stitch.threshold == 0.3
    with pytest.raises(ValueError, match="hidden size"):
        llm.generate(ids, assistant_model=slm, stitch_router=Router(48), max_new_tokens=3)


def test_eval_harness_router_method_accepts_a_router_or_a_path(tmp_path):
    from hf_rstitch.eval.methods import GenSettings, LearnedRouter

    llm, slm = make_pair("llama")
    router = Router(32, width=8, num_blocks=2, threshold=0.3)
    router.save_pretrained(tmp_path)
    settings = GenSettings(max_new_tokens=6)
    by_object = LearnedRouter(llm, slm, settings, router=router, threshold=0.3).run(prompt())
    by_path = LearnedRouter(llm, slm, settings, router=str(tmp_path)).run(prompt())
    assert by_object[0] == by_path[0] and by_object[1]["new_tokens"] == 6


def test_router_threshold_argument_wins_over_a_stored_one():
    """transformers moves a generate argument named like a config entry into the config: with a
    stored ``stitch_threshold``, ``stitch_threshold=0.7`` must still reach the router policy."""
    llm, slm = make_pair("llama")
    router = Router(32, width=8, num_blocks=2, threshold=0.3)
    llm.generation_config.stitch_threshold = 0.1
    try:
        out = llm.generate(prompt(), assistant_model=slm, stitch_router=router, stitch_threshold=0.7,
                           max_new_tokens=4, return_dict_in_generate=True)
    finally:
        llm.generation_config.stitch_threshold = None
    assert out.stitch.threshold == 0.7
