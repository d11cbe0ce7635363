"""benchmarks/serve_alone.py: the engine alone's loop freezes the start-up objects out of the collector as ``rstitch
serve`` does, and gives every object back afterwards, so that an engine its caller drops next is freed."""

import gc
import weakref


class _Cycle:  # a stand-in for an engine: its lanes and their parts refer to each other, so only the collector frees it
    pass


def test_an_engine_dropped_after_the_loop_is_freed_even_where_objects_were_frozen_before():
    """A fresh CPython 3.12 starts with objects in the permanent generation (375 on 3.12.1): the loop must not take
    that for a caller's freeze and leave what it froze frozen (an H200 kept a dropped engine's 99.8 GiB of KV)."""
    from serve_alone import _frozen

    try:
        gc.freeze()  # what Python 3.12 holds frozen at start-up, simulated here on any version
        engine = _Cycle()
        engine.me = engine
        gone = weakref.ref(engine)
        with _frozen():
            assert gc.get_freeze_count() > 0
            assert not any(o is engine for o in gc.get_objects())  # frozen while the loop runs
        del engine
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
