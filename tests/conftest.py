"""The GPU tier's selection: ``make test-gpu`` runs ``-m "gpu or cuda"``, the tests that exercise CUDA.

``gpu`` marks a test that needs CUDA; ``cuda`` is added here to every test that runs on CUDA where there is one
and on the CPU otherwise (the CPU tiers run it there already): one parametrized on a ``"cuda"`` device, one
whose ``skipif`` says it needs CUDA, or one marked ``cuda`` by hand (a test that picks its device inside).
"""

import pytest


def _runs_on_cuda(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(str(v).startswith("cuda") for v in params.values()):
        return True
    return any("cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("cuda") is None and _runs_on_cuda(item):
            item.add_marker(pytest.mark.cuda)
