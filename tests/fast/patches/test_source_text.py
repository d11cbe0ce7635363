"""source_text.source: inspect.getsource read once a function, None where there is no source."""

import inspect

from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hf_rstitch.fast.source_text import source


def test_source_is_getsource_kept_per_function_and_none_without_source():
    fn = LlamaRMSNorm.forward
    assert source(fn) == inspect.getsource(fn)
    hits = source.cache_info().hits
    assert source(fn) is source(fn) and source.cache_info().hits == hits + 2  # read once
    assert source(len) is None and source(eval("lambda: 0")) is None  # a built-in; code made at run time
