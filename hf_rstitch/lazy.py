"""Package names that import their module on first use, so that importing the package stays cheap (no torch):
``__getattr__, __dir__ = lazy_names(__name__, {"Router": ".model"}, globals())`` in its ``__init__``."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, table: dict[str, str], namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """The package's module-level ``__getattr__`` (a name of ``table`` from its module, relative to ``package``)
    and ``__dir__`` (tab completion and ``dir()`` show the lazy names too)."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
