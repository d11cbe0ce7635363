"""Rewrite references to moved modules (tools/moves_34b.txt) in the given files. Idempotent.

    python3 tools/apply_moves.py $(git ls-files '*.py' '*.md' '*.ipynb' '*.sh' '*.toml' '*.txt' Makefile)

Relative imports inside the package are resolved against the module's location *before* the moves
(a moved file keeps its old relative imports until this runs), mapped, and written relative again;
dotted names (``<old module>.<attr>``), file paths (``<old/module>.py``) and names imported from a split
package (``from <old package> import A, B``: each name to its new home, the ``symbol`` lines) are rewritten too.
The moves themselves (``git mv``) are not done here.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES = Path(__file__).with_name("moves_34b.txt")


def read_moves(path: Path = MOVES):
    modules, symbols, packages, tests = {}, {}, {}, {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, old, _, new = line.split()[:4]
        {"module": modules, "symbol": symbols, "package": packages, "test": tests}[kind][old] = new
    return modules, symbols, packages, tests


MODULES, SYMBOLS, PACKAGES, TESTS = read_moves()
OLD_OF = {new: old for old, new in MODULES.items()}


def new_name(dotted: str) -> str:
    """The new dotted name of ``dotted`` (a module, a module's attribute, or a split package's symbol), after
    every move that applies (a name can move twice: module, then a function out of it)."""
    for _ in range(4):
        moved = _new_name(dotted)
        if moved == dotted:
            return dotted
        dotted = moved
    return dotted


def _new_name(dotted: str) -> str:
    for old in sorted(MODULES, key=len, reverse=True):
        if dotted == old or dotted.startswith(old + "."):
            return MODULES[old] + dotted[len(old):]
    for old in SYMBOLS:
        if dotted == old or dotted.startswith(old + "."):
            return SYMBOLS[old] + "." + dotted[len(old.rpartition(".")[0]) + 1:]
    return PACKAGES.get(dotted, dotted)


def module_of(path: Path) -> str | None:
    parts = list(path.resolve().with_suffix("").parts)
    if "hf_rstitch" not in parts:
        return None
    parts = parts[len(parts) - 1 - parts[::-1].index("hf_rstitch"):]
    return ".".join(parts)


def split_import(base: str, names: list[str]) -> list[tuple[str, list[str]]]:
    """``from base import names`` after the moves: [(new base, names)], in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        real = name.split(" as ")[0].strip()
        full = f"{base}.{real}"
        moved = new_name(full)
        if moved != full:
            target = moved.rpartition(".")[0]
        else:
            target = new_name(base) if base in MODULES or base in PACKAGES else base
        groups.setdefault(target, []).append(name)
    return list(groups.items())


def relative(target: str, package: str) -> str:
    """``target`` written relative to ``package`` (``..decode.lane``)."""
    t, p = target.split("."), package.split(".")
    common = 0
    while common < min(len(t), len(p)) and t[common] == p[common]:
        common += 1
    dots = "." * (len(p) - common + 1)
    return dots + ".".join(t[common:])


def known(dotted: str, root: Path = Path(__file__).resolve().parents[1]) -> bool:
    """Whether ``dotted`` is a module or package of the tree as it is now (the moves done)."""
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def fix_relative(text: str, module: str, is_package: bool) -> str:
    old_module = OLD_OF.get(module, module)
    old_pkg = old_module if is_package else old_module.rpartition(".")[0]
    new_pkg = module if is_package else module.rpartition(".")[0]

    def resolve(pkg, dots, rest):
        base = pkg.split(".")
        return ".".join(base[:len(base) - len(dots) + 1] + ([rest] if rest else []))

    def repl(m):
        indent, dots, rest, names = m.group(1), m.group(2), m.group(3), m.group(4)
        base = resolve(old_pkg, dots, rest)
        if old_pkg != new_pkg and not (known(base) or base in MODULES or base in PACKAGES):
            base = resolve(new_pkg, dots, rest)  # written at the new location already
        names_list = [n.strip() for n in names.strip("()").split(",") if n.strip()]
        groups = split_import(base, names_list)
        rels = [relative(target, new_pkg) for target, _ in groups]
        if len(groups) == 1 and rels[0] == dots + rest:
            return m.group(0)  # nothing moved: the line as it was
        return "\n".join(f"{indent}from {rel} import {', '.join(ns)}" for rel, (_, ns) in zip(rels, groups))

    return re.sub(r"^([ \t]*)from (\.+)([\w.]*) import ([\w ,]*\w|\([\w ,\n]+\))(?=[ \t]*(#.*)?$)", repl, text, flags=re.M)


def fix_absolute(text: str) -> str:
    def imp(m):
        indent, base, names = m.group(1), m.group(2), m.group(3)
        names_list = [n.strip() for n in names.strip("()").split(",") if n.strip()]
        groups = split_import(base, names_list)
        if len(groups) == 1 and groups[0][0] == base:
            return m.group(0)  # nothing moved: the line as it was
        return "\n".join(f"{indent}from {t} import {', '.join(ns)}" for t, ns in groups)

    text = re.sub(r"^([ \t]*)from (hf_rstitch(?:\.\w+)*) import ([\w ,]*\w|\([\w ,\n]+\))(?=[ \t]*(#.*)?$)", imp, text, flags=re.M)
    olds = sorted(set(MODULES) | set(SYMBOLS) | set(PACKAGES), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.])(%s)(?![\w])" % "|".join(map(re.escape, olds)))
    text = pattern.sub(lambda m: new_name(m.group(1)), text)
    for old, new in MODULES.items():
        text = re.sub(r"(?<![\w/])%s\.py\b" % re.escape(old.replace(".", "/")), new.replace(".", "/") + ".py", text)
    for old, new in TESTS.items():
        text = re.sub(r"(?<![\w/])%s\b" % re.escape(old), new, text)
    for old, new in PACKAGES.items():
        text = re.sub(r"(?<![\w/])%s/(?!\w+\.py)" % re.escape(old.replace(".", "/")), new.replace(".", "/") + "/", text)
    return text


def fix(path: str) -> bool:
    p = Path(path)
    text = original = p.read_text()
    module = module_of(p) if p.suffix == ".py" else None
    if module is not None:
        is_package = p.name == "__init__.py"
        if is_package:
            module = module.rpartition(".")[0]
        text = fix_relative(text, module, is_package)
    text = fix_absolute(text)
    if text != original:
        p.write_text(text)
        print("fixed", path)
    return text != original


if __name__ == "__main__":
    for f in sys.argv[1:]:
        fix(f)
