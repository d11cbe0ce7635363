"""The shape of hf_rstitch, measured: import cycles, layers, imports that run the wrong way, and size.

    python3 tools/architecture.py            # everything below (runs the kernel tests twice, as CI does:
                                             # ~7 min of CPU under Triton's interpreter)
    python3 tools/architecture.py --quick    # without the kernel tests and `duplicates`
    python3 tools/architecture.py --root DIR # another checkout (git archive REV | tar -x -C DIR)

It reads the source (``ast``), never imports the package. An import is an edge from the module that
writes it to the module it names, at module level or inside a function alike (both run sooner or
later); ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``'s
``__init__``. A parent package's ``__init__`` that Python runs on the way is not an edge, and neither is
``import hf_rstitch`` (the facade: it runs before any module of the package anyway).

The layers (STYLE.md: core <- decode <- fast <- engine <- hf <- eval / batching <- cli); a module may import
its own layer or a lower one, never a higher one:

0 core      ``core``, ``resources``, ``sources`` (torch-only decisions and torch-free helpers)
1 decode    ``decode`` (the lane protocol, the eager lane, the step, the loop)
2 fast      ``fast`` (the fast engine's lanes and kernels); ``router`` (the router as a decode-time policy)
3 engine    ``engine`` (a pair's engine: which one runs it, and how it is built)
4 hf        ``hf`` (the glue to transformers' ``generate``); ``latency`` (the latency model and the profiler
            that fits it, which runs models through ``hf``)
5 eval/batching/training ``eval``, ``batching`` (the request engine), ``serve`` (its HTTP server),
            ``toyworld``, ``training`` (training the router: a client of eval and toyworld)
6 cli       ``cli``, ``hub_template``, ``ui`` (the Gradio app), the package facade ``hf_rstitch`` (``__init__``, ``__main__``)

The layer of a module is that of the longest prefix listed in :data:`LAYERS`.
:func:`graph`, :func:`cycles` and :func:`upward` are what ``tests/test_layers.py`` asserts on.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hf_rstitch"
LAYER_NAMES = ["core", "decode", "fast", "engine", "hf", "eval/batching/training", "cli"]
LAYERS = {
    "hf_rstitch": 6, "hf_rstitch.__main__": 6, "hf_rstitch.cli": 6, "hf_rstitch.hub_template": 6,
    "hf_rstitch.ui": 6,
    "hf_rstitch.core": 0, "hf_rstitch.resources": 0, "hf_rstitch.sources": 0, "hf_rstitch.extras": 0,
    "hf_rstitch.threads": 0, "hf_rstitch.lazy": 0, "hf_rstitch.configs": 0,
    "hf_rstitch.decode": 1,
    "hf_rstitch.fast": 2, "hf_rstitch.router": 2,
    "hf_rstitch.engine": 3,
    "hf_rstitch.hf": 4, "hf_rstitch.latency": 4,
    "hf_rstitch.eval": 5, "hf_rstitch.batching": 5, "hf_rstitch.serve": 5, "hf_rstitch.toyworld": 5,
    "hf_rstitch.training": 5,
}
KERNEL_TESTS = [f"tests/fast/{name}.py" for name in
                ("kernels/test_gemv", "kernels/test_gated", "patches/test_folds", "kernels/test_decode_attention",
                 "kernels/test_fused_entropy", "kernels/test_rope_store")]
# a place that resolves an engine spec: compares it with an engine name, or calls a piece of resolution
# (the env default, the "auto" decision, the old partial resolver); a call of the one resolver is a use, not a place
RESOLVING = re.compile(r"""(engine|spec)\w*\s*[!=]=\s*["'](default|fast|auto)["']"""
                       r"|\b(requested_engine|pick_engine|choose_engine)\(")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return name in mods and mods[name].name == "__init__.py"


def imports(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported module of the package, line, at module level?) for each import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if _is_package(name, mods) else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # imports under a module-level if/try still run at import
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name and target != PACKAGE:
                out.append((target, node.lineno, id(node) in top_level))
    return out


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, int, bool]]]:
    mods = modules(root)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def layer(name: str) -> int:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise KeyError(f"{name} has no layer: add its package to LAYERS in tools/architecture.py")


def cycles(g: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _, _ in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def upward(g: dict) -> list[tuple[str, int, str, bool]]:
    """(importer, line, imported, module level?) for each import from a lower layer to a higher one."""
    return [(a, line, b, top) for a, edges in sorted(g.items()) for b, line, top in edges if layer(b) > layer(a)]


def packages(g: dict) -> dict:
    """The graph of subpackages (``hf_rstitch.eval``, ...; a top-level module stands for itself)."""
    top = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    out: dict = {}
    for a, edges in g.items():
        out.setdefault(top(a), []).extend((top(b), line, t) for b, line, t in edges if top(b) != top(a))
    return out


def depth(g: dict) -> int:
    """Layers the module graph stands on: the longest chain of imports, a cycle counted as one module."""
    comp = {v: i for i, c in enumerate(cycles(g)) for v in c}
    node = lambda v: comp.get(v, v)  # noqa: E731
    edges: dict = {}
    for a, es in g.items():
        edges.setdefault(node(a), set()).update(node(b) for b, _, _ in es if node(b) != node(a))
    memo: dict = {}

    def height(v):
        if v not in memo:
            memo[v] = 1 + max((height(w) for w in edges.get(v, ())), default=0)
        return memo[v]

    return max(height(v) for v in list(edges))


def engine_resolved(root: Path = ROOT) -> dict[str, list[int]]:
    """{file:function: lines} where the package resolves an engine spec (see RESOLVING)."""
    out: dict[str, list[int]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        spans = [(n.lineno, n.end_lineno, n.name) for n in ast.walk(ast.parse(text))
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for i, line in enumerate(lines, 1):
            code = line.split("#")[0]
            if not RESOLVING.search(code) or code.lstrip().startswith(("def ", '"', "'", "``", ">>>")):
                continue
            inner = [s for s in spans if s[0] < i <= s[1]]
            name = min(inner, key=lambda s: s[1] - s[0])[2] if inner else "<module>"
            out.setdefault(f"{path.relative_to(root)}:{name}", []).append(i)
    return out


# a test that branches on which engine runs: a builder's class, the eager flag, a kind compared with a name, or
# the "auto picked the fast engine" flag
ENGINE_KIND = re.compile(r"""\bis_eager\(|isinstance\([^()]*,\s*\(?[^()]*(EagerEngine|FastEngine|FastConfig)"""
                         r"""|\.eager\b|["']eager["']|(?<!["'\w])auto(?![\w"'])(?!\s*=)|\b(engine|spec|kind|name)\w*\s*(\[[^]]*\]\s*)?"""
                         r"""([!=]=|\bin\b|\bis\b)\s*[("']*(default|fast|auto)\b""")


def engine_branches(root: Path = ROOT) -> dict[str, list[int]]:
    """{file: lines} where the package branches on the engine kind: the test of an ``if``, a conditional
    expression, a ``while`` or a comprehension's ``if`` that reads it (see :data:`ENGINE_KIND`)."""
    out: dict[str, list[int]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        text = path.read_text()
        tests = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                tests.append(node.test)
            elif isinstance(node, ast.comprehension):
                tests.extend(node.ifs)
            elif isinstance(node, (ast.Assign, ast.Return)) and isinstance(node.value, (ast.BoolOp, ast.UnaryOp)):
                tests.append(node.value)
        lines = sorted({t.lineno for t in tests if ENGINE_KIND.search(ast.get_source_segment(text, t) or "")})
        if lines:
            out[str(path.relative_to(root))] = lines
    return out


def fallbacks(root: Path = ROOT) -> list[str]:
    """``file:function`` of each place that handles a failure of the fast engine by running the eager one: the
    functions that remember the pair as failed (``remember_failure(``), each a fallback of its own."""
    out = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "remember_failure":
                if "remember_failure(" in (ast.get_source_segment(text, node) or ""):
                    out.append(f"{path.relative_to(root)}:{node.name}")
    return out


WALKS = {  # the values whose trip through the calls the report follows: (FILE:FUNCTION:PARAM, what it is)
    "server_config": "hf_rstitch/serve/config.py:build_server:cfg",
    "stitch_engine": "hf_rstitch/hf/decode.py:stitched_decode:stitch_engine",
}


def walk(root: Path, spec: str) -> dict:
    """Follow one value through the calls that pass it on (``farm-studio walk FILE:FUNCTION:PARAM``): the files it
    enters, the moves back up to a higher layer, the files in order, and the calls it is lost in as a function
    passed in as a parameter (``lost``); ``{"error": ...}`` where the tool is missing."""
    try:
        done = subprocess.run(["farm-studio", "walk", spec, "--repo", str(root)], cwd=root, capture_output=True,
                              text=True, timeout=600)
    except (FileNotFoundError, subprocess.TimeoutExpired) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    text = done.stdout
    head = re.search(r"(\d+) stays; (\d+) rooms; (\d+) climbs? back up", text)
    if head is None:
        return {"error": (text or done.stderr).strip().splitlines()[:1]}
    rooms = re.findall(r"^\s*\d+\.\s+floor\s+\d+\s+(\S+)", text, re.M)
    lost = re.search(r"Where the program lost sight of me.*?: (.*)", text)
    return {"files": int(head.group(2)), "up": int(head.group(3)), "route": list(dict.fromkeys(rooms)),
            "lost": lost.group(1) if lost else ""}


def sizes(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """{package or top folder: (Python files, lines)} over the files git tracks (and new ones it does not ignore)."""
    done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=root,
                          capture_output=True, text=True)
    files = done.stdout.split() if done.returncode == 0 else [str(p.relative_to(root)) for p in root.rglob("*.py")]
    out: dict[str, list[int]] = {}
    for f in files:
        if not (root / f).exists():
            continue
        parts = f.split("/")
        key = "/".join(parts[:2]) if parts[0] == PACKAGE and len(parts) > 2 else parts[0] if len(parts) > 1 else "."
        n = len((root / f).read_text().splitlines())
        row = out.setdefault(key, [0, 0])
        row[0] += 1
        row[1] += n
    return {k: tuple(v) for k, v in sorted(out.items())}


def long_functions(root: Path = ROOT, limit: int = 40) -> list[tuple[str, str, int]]:
    """(file, function, lines) for each function of the package longer than ``limit`` lines."""
    out = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((str(path.relative_to(root)), node.name, n))
    return out


def duplicate_pairs(root: Path = ROOT) -> str:
    try:
        text = subprocess.run(["duplicates", "--seconds", "120"], cwd=root, capture_output=True, text=True).stdout
    except FileNotFoundError:
        return "n/a (no `duplicates` command here)"
    return text.splitlines()[0] if text else "n/a"


def kernel_tests_ci_runs(root: Path = ROOT) -> dict:
    """The kernel tests that run (not skip) under the environments CI gives them: `make test` / `make
    test-slow` (no TRITON_INTERPRET), plus TRITON_INTERPRET=1 where .ci/run calls `make test-kernels`."""
    ci = (root / ".ci/run").read_text()
    envs = [{}] + ([{"TRITON_INTERPRET": "1"}] if "test-kernels" in ci else [])
    ran, total = set(), 0
    for extra in envs:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), **extra}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *KERNEL_TESTS],
                             cwd=root, env=env, capture_output=True, text=True).stdout
        ran |= set(re.findall(r"^(?:PASSED|FAILED|ERROR) (\S+)", out, re.M))
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        total = max(total, sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped|error|xfailed|xpassed)",
                                                          summary)))
    return {"run": len(ran), "collected": total, "ci_calls_test_kernels": "test-kernels" in ci}


def report(root: Path = ROOT, quick: bool = False) -> dict:
    g = graph(root)
    cyc, up = cycles(g), upward(g)
    print(f"import cycles: {len(cyc)}")
    for c in cyc:
        print("  " + " <-> ".join(m.removeprefix("hf_rstitch.") for m in c))
    pcyc = cycles(packages(g))
    print(f"import cycles between subpackages: {len(pcyc)}")
    for c in pcyc:
        print("  " + " <-> ".join(m.removeprefix("hf_rstitch.") for m in c))
    print(f"layers (longest import chain): {depth(g)} modules, {depth(packages(g))} subpackages")
    print(f"imports from a lower layer to a higher one: {len(up)}")
    for a, line, b, top in up:
        print(f"  {a} ({LAYER_NAMES[layer(a)]}) :{line} -> {b} ({LAYER_NAMES[layer(b)]})"
              f"{'' if top else '  [inside a function]'}")
    places = engine_resolved(root)
    resolving_files = {f.split(":")[0] for f in places}
    print(f"places the engine is resolved: {len(places)} functions in {len(resolving_files)} files, "
          f"{sum(map(len, places.values()))} lines")
    for f, lines in places.items():
        print(f"  {f}: {', '.join(map(str, lines))}")
    branches = engine_branches(root)
    print(f"files that branch on the engine kind: {len(branches)}")
    for f, lines in branches.items():
        print(f"  {f}: {', '.join(map(str, lines))}")
    falls = fallbacks(root)
    print(f"fallbacks to the eager engine: {len(falls)}" + "".join(f"\n  {f}" for f in falls))
    table = sizes(root)
    total = sum(n for _, n in table.values())
    print(f"Python files and lines ({total} lines in all):")
    for k, (files, n) in table.items():
        print(f"  {k:24s} {files:4d} files {n:6d} lines {100 * n / total:5.1f} %")
    bench = table.get("benchmarks", (0, 0))[1]
    lib = sum(n for k, (_, n) in table.items() if k == PACKAGE or k.startswith(PACKAGE + "/"))
    print(f"benchmarks/: {bench} lines, {100 * bench / (bench + lib):.1f} % of library + benchmarks")
    longs = long_functions(root)
    print(f"functions over 40 lines: {len(longs)}")
    for f, fn, n in sorted(longs, key=lambda r: -r[2]):
        print(f"  {f}:{fn} {n}")
    out = {"cycles": len(cyc), "package_cycles": len(pcyc), "layers": depth(g), "package_layers": depth(packages(g)), "upward": len(up), "engine_resolved_functions": len(places), "engine_resolved_files": len(resolving_files),
           "engine_resolved_lines": sum(map(len, places.values())), "functions_over_40": len(longs),
           "python_lines": total, "benchmarks_share_of_all": round(bench / total, 3),
           "benchmarks_share_of_library_and_benchmarks": round(bench / (bench + lib), 3),
           "benchmarks_files": table.get("benchmarks", (0, 0))[0], "engine_branch_files": len(branches),
           "fallbacks": len(falls)}
    if not quick:
        for name, spec in WALKS.items():
            trip = walk(root, spec)
            out[f"walk_{name}"] = {k: v for k, v in trip.items() if k != "route"}
            print(f"walk of {spec}: {trip}")
        out["library_duplicates"] = duplicate_pairs(root / PACKAGE)
        print(f"duplicates in the library: {out['library_duplicates']}")
        out["duplicates"] = duplicate_pairs(root)
        print(f"duplicates: {out['duplicates']}")
        out["kernel_tests"] = kernel_tests_ci_runs(root)
        print(f"kernel tests CI runs: {out['kernel_tests']['run']} of {out['kernel_tests']['collected']}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    report(Path(args[args.index("--root") + 1]).resolve() if "--root" in args else ROOT, quick="--quick" in args)
