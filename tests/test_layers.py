"""Dependencies point one way (STYLE.md: core <- decode <- fast <- engine <- hf <- eval / batching <- cli).

The import graph -- module-level and function-level imports alike -- has no cycle, and no module imports
one of a higher layer. The layers and how the graph is read: ``tools/architecture.py``, which also prints
the whole report (``python3 tools/architecture.py``).
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("architecture", ROOT / "tools" / "architecture.py")
architecture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(architecture)


def test_no_import_cycles():
    cycles = architecture.cycles(architecture.graph(ROOT))
    assert cycles == [], "import cycles (break each: move the function to its home or pass it in): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    up = architecture.upward(architecture.graph(ROOT))
    assert up == [], "imports from a lower layer to a higher one (see LAYERS in tools/architecture.py): " + "; ".join(
        f"{a}:{line} -> {b}" for a, line, b, _ in up)


def test_every_module_has_a_layer():
    for name in architecture.modules(ROOT):
        architecture.layer(name)  # raises for a package missing from LAYERS
