"""``out.stitch_traces``: always one trace per row; ``out.stitch`` keeps its batch-1 shorthand."""

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import StitchTrace
from tiny_models import left_pad, make_pair, prompt

N_NEW = 6


def test_stitch_traces_is_a_list_at_every_batch_size():
    llm, slm = make_pair("llama")
    kw = dict(assistant_model=slm, stitch_threshold=0.5, max_new_tokens=N_NEW, return_dict_in_generate=True)
    one = llm.generate(prompt(5, seed=1), **kw)
    assert isinstance(one.stitch, StitchTrace)
    assert one.stitch_traces == [one.stitch]
    ids, mask = left_pad([prompt(5, seed=1), prompt(8, seed=2)])
    two = llm.generate(ids, attention_mask=mask, **kw)
    assert isinstance(two.stitch, list) and two.stitch_traces == two.stitch and len(two.stitch_traces) == 2
    assert two.stitch_traces[0].roles == one.stitch.roles  # row 0 is the batch-1 prompt
