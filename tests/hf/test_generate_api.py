"""generate() integration: sampling, processors, stopping, streamers, outputs, config, patching."""

import pytest
import torch
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    TextStreamer,
)
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import hf_rstitch
from hf_rstitch import Role
from tiny_models import VOCAB, make_pair, make_tokenizer, prompt

N_NEW = 16


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def stitched(llm, slm, ids, tau=0.5, **kw):
    kw.setdefault("max_new_tokens", N_NEW)
    return llm.generate(ids, assistant_model=slm, stitch_threshold=tau, **kw)


# ---- sampling -----------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible(pair):
    llm, slm = pair
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(stitched(llm, slm, prompt(), do_sample=True, temperature=0.8, top_k=20, top_p=0.9))
    assert torch.equal(*runs)


def test_sampling_at_threshold_one_matches_slm_sampling(pair):
    llm, slm = pair
    kw = dict(do_sample=True, temperature=0.7, top_k=30, top_p=0.95, max_new_tokens=N_NEW)
    torch.manual_seed(3)
    ours = stitched(llm, slm, prompt(), 1.0, **kw)
    torch.manual_seed(3)
    assert torch.equal(ours, slm.generate(prompt(), **kw))


# ---- logits processors and stopping -------------------------------------------------------
class Ban(LogitsProcessor):
    def __init__(self, ids):
        self.ids = ids

    def __call__(self, input_ids, scores):
        scores[:, self.ids] = float("-inf")
        return scores


def test_user_logits_processor_and_builtin_penalty_apply(pair):
    llm, slm = pair
    plain = stitched(llm, slm, prompt(), 1.0)[0, prompt().shape[1]:].tolist()
    banned = plain[:3]
    out = stitched(llm, slm, prompt(), 0.5, logits_processor=LogitsProcessorList([Ban(banned)]))
    assert not set(out[0, prompt().shape[1]:].tolist()) & set(banned)
    ours = stitched(llm, slm, prompt(), 1.0, repetition_penalty=1.5, no_repeat_ngram_size=2)
    assert torch.equal(ours, slm.generate(prompt(), max_new_tokens=N_NEW, repetition_penalty=1.5,
                                          no_repeat_ngram_size=2))


def test_eos_stops_generation(pair):
    llm, slm = pair
    ids = prompt()
    free = stitched(llm, slm, ids, 1.0)
    stop_at = free[0, ids.shape[1] + 4].item()
    out = stitched(llm, slm, ids, 1.0, eos_token_id=stop_at, return_dict_in_generate=True)
    assert out.sequences.shape[1] == ids.shape[1] + 5 and out.sequences[0, -1].item() == stop_at
    assert out.stitch.n_tokens == 5


def test_stop_strings_with_tokenizer(pair):
    llm, slm = pair
    tok = make_tokenizer()
    ids = prompt()
    free = stitched(llm, slm, ids, 1.0)
    word = tok.convert_ids_to_tokens(free[0, ids.shape[1] + 3].item())
    out = stitched(llm, slm, ids, 1.0, stop_strings=[word], tokenizer=tok)
    assert out.shape[1] == ids.shape[1] + 4
    with pytest.raises(ValueError, match="stop_strings.*tokenizer"):
        stitched(llm, slm, ids, 1.0, stop_strings=[word])


# ---- streamers ----------------------------------------------------------------------------
class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_streamer_gets_prompt_then_exactly_the_new_tokens(pair):
    llm, slm = pair
    ids = prompt()
    rec = Recorder()
    out = stitched(llm, slm, ids, 0.5, streamer=rec)
    assert rec.puts[0] == ids[0].tolist()
    assert sum(rec.puts[1:], []) == out[0, ids.shape[1]:].tolist() and rec.ended


def test_text_streamer_prints_the_generated_text(pair, capsys):
    llm, slm = pair
    tok = make_tokenizer()
    ids = prompt()
    out = stitched(llm, slm, ids, 0.5, streamer=TextStreamer(tok, skip_prompt=True))
    printed = capsys.readouterr().out.strip()
    assert printed == tok.decode(out[0, ids.shape[1]:]).strip()


# ---- outputs ------------------------------------------------------------------------------
def test_output_class_scores_and_logits(pair):
    llm, slm = pair
    ids = prompt()
    out = stitched(llm, slm, ids, 0.0, return_dict_in_generate=True, output_scores=True, output_logits=True)
    ref = llm.generate(ids, max_new_tokens=N_NEW, return_dict_in_generate=True, output_scores=True,
                       output_logits=True)
    assert isinstance(out, GenerateDecoderOnlyOutput) and isinstance(out.stitch, hf_rstitch.StitchTrace)
    assert len(out.scores) == len(out.logits) == out.stitch.n_tokens
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b.double() if a.dtype == torch.float64 else b.float())
    assert out.stitch.llm_tokens == N_NEW


def test_trace_provenance_fields(pair):
    llm, slm = pair
    out = stitched(llm, slm, prompt(), 0.6, return_dict_in_generate=True)
    t = out.stitch
    assert len(t.roles) == len(t.entropies) == len(t.handovers) == len(t.slm_entropies) == t.n_tokens
    assert t.llm_tokens + t.slm_tokens == t.n_tokens and t.threshold == 0.6
    for role, h, handed, slm_h in zip(t.roles, t.entropies, t.handovers, t.slm_entropies):
        if role is Role.SLM:
            assert h <= 0.6 and slm_h == h and not handed
        if handed:
            assert slm_h > 0.6 and role is Role.LLM


# ---- vocabulary mismatch ------------------------------------------------------------------
def test_models_with_different_vocab_sizes_stay_in_the_shared_range():
    llm, slm = make_pair("qwen2", llm_vocab=VOCAB + 8)
    ids = prompt()
    out = stitched(llm, slm, ids, 0.0, return_dict_in_generate=True, output_scores=True, max_new_tokens=30)
    assert out.sequences.max().item() < VOCAB
    assert all(s.shape[-1] == VOCAB + 8 and torch.isinf(s[:, VOCAB:]).all() for s in out.scores)
    mixed = stitched(llm, slm, ids, 0.6, return_dict_in_generate=True, output_scores=True, max_new_tokens=30)
    assert torch.stack(mixed.scores).shape[-1] == VOCAB + 8


# ---- configuration and entry points -------------------------------------------------------
def test_threshold_from_generation_config(pair):
    llm, slm = pair
    ids = prompt()
    expected = stitched(llm, slm, ids, 1.0)
    cfg = GenerationConfig(stitch_threshold=1.0, max_new_tokens=N_NEW, eos_token_id=1, pad_token_id=2)
    assert torch.equal(llm.generate(ids, assistant_model=slm, generation_config=cfg), expected)
    llm.generation_config.stitch_threshold = 1.0
    try:
        assert torch.equal(llm.generate(ids, assistant_model=slm, max_new_tokens=N_NEW), expected)
    finally:
        del llm.generation_config.stitch_threshold


def test_callable_form_without_the_patch(pair):
    llm, slm = pair
    ids = prompt()
    expected = stitched(llm, slm, ids, 0.5)
    hf_rstitch.unpatch()
    try:
        assert not hf_rstitch.is_patched()
        out = llm.generate(ids, custom_generate=hf_rstitch.stitched_decode, stitch_slm=slm, stitch_threshold=0.5,
                           max_new_tokens=N_NEW)
        assert torch.equal(out, expected)
        with pytest.raises(ValueError, match="stitch_threshold"):  # transformers' own unused-kwarg error
            llm.generate(ids, assistant_model=slm, stitch_threshold=0.5, max_new_tokens=N_NEW)
    finally:
        hf_rstitch.patch()


def test_plain_and_assisted_generate_are_untouched(pair):
    llm, slm = pair
    ids = prompt()
    patched = (llm.generate(ids, max_new_tokens=N_NEW), llm.generate(ids, assistant_model=slm, max_new_tokens=N_NEW))
    hf_rstitch.unpatch()
    original = GenerationMixin.generate
    try:
        plain = (llm.generate(ids, max_new_tokens=N_NEW), llm.generate(ids, assistant_model=slm, max_new_tokens=N_NEW))
    finally:
        hf_rstitch.patch()
        hf_rstitch.patch()  # idempotent
    assert all(torch.equal(a, b) for a, b in zip(patched, plain))
    hf_rstitch.unpatch()
    assert GenerationMixin.generate is original
    hf_rstitch.patch()


def test_replay_policy_reproduces_a_route(pair):
    llm, slm = pair
    ids = prompt()
    first = stitched(llm, slm, ids, 0.6, return_dict_in_generate=True)
    replay = llm.generate(ids, assistant_model=slm, stitch_policy=hf_rstitch.ReplayPolicy(first.stitch.roles),
                          max_new_tokens=N_NEW, return_dict_in_generate=True)
    assert replay.stitch.roles == first.stitch.roles
    assert torch.equal(replay.sequences, first.sequences)


def test_timing_records_seconds_per_call(pair):
    llm, slm = pair
    out = stitched(llm, slm, prompt(), 0.6, return_dict_in_generate=True, stitch_timing=True)
    assert all(c.seconds is not None and c.seconds > 0 for c in out.stitch.calls)
    assert "forward_seconds" in out.stitch.summary()


def test_quick_stopping_answers_as_transformers_criteria():
    """generate's own max-length and EOS criteria, as one stopper: the same answer at every width and token;
    any other criterion keeps the list."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    from hf_rstitch.hf.decode import quick_stopping

    g = torch.Generator().manual_seed(0)
    for criteria in ([MaxLengthCriteria(12)], [EosTokenCriteria([3, 5])], [MaxLengthCriteria(14), EosTokenCriteria(4)],
                     [EosTokenCriteria(torch.tensor([2])), MaxLengthCriteria(11, max_position_embeddings=10)]):
        criteria = StoppingCriteriaList(criteria)
        stop = quick_stopping(criteria)
        for width in range(8, 16):
            seq = torch.randint(0, 7, (3, width), generator=g)
            assert torch.equal(stop(seq, None), criteria(seq, None)), (criteria, seq)
    assert quick_stopping(StoppingCriteriaList([])) is None
    assert quick_stopping(StoppingCriteriaList([MaxLengthCriteria(9), _Custom()])) is None


class _Custom:
    def __call__(self, seq, scores):
        return torch.zeros(seq.shape[0], dtype=torch.bool)


def test_only_callbacks_known_to_be_pure_let_the_loop_guess():
    """A guessed step undone at a hand-over calls the processors and criteria again: transformers' own answer from
    their inputs alone, but the stateful few (a second model's cache) and any from outside are not known to."""
    from transformers import (MaxLengthCriteria, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              UnbatchedClassifierFreeGuidanceLogitsProcessor)

    from hf_rstitch.hf.decode import pure_callbacks

    llm, _ = make_pair("llama")
    pure = [TemperatureLogitsWarper(0.7), RepetitionPenaltyLogitsProcessor(1.2)]
    assert pure_callbacks(pure, [MaxLengthCriteria(20)]) and pure_callbacks(None, None)
    assert not pure_callbacks([*pure, UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, llm)], None)
    assert not pure_callbacks(pure, [lambda ids, scores: torch.zeros(ids.shape[0], dtype=torch.bool)])
