"""Export a Hugging Face Hub ``custom_generate`` repository that runs R-Stitch without hf-rstitch.

    rstitch export-hub-template DIR          # or: hf_rstitch.hub_template.export(DIR)
    # push DIR to a Hub repo, then, with only torch + transformers installed:
    llm.generate(**inputs, custom_generate="<org>/<repo>", trust_remote_code=True,
                 assistant_model=slm, stitch_threshold=0.02)

transformers loads ``custom_generate/generate.py`` from the repo (or a local folder) and calls its
``generate(model=llm, **every generate argument)`` before any preparation. The exported file is
this package's decode path flattened into one module: the sources listed in :data:`MODULES`
concatenated in dependency order, their intra-package imports removed, and a ``generate`` entry
point that calls :func:`hf_rstitch.hf.entry.run_stitched` -- the same translation the ``generate``
patch uses (``assistant_model`` becomes ``stitch_slm``, stop strings become a stopping criterion,
then transformers' own ``generate`` runs with the flattened ``stitched_decode`` as its
``custom_generate`` callable). One file means no
relative imports for transformers' dynamic-module loader to chase, and nothing to install.

The learned router and the fast engine are not flattened: they need hf-rstitch installed, and the
template says so when asked for them; a call that names no ``stitch_engine`` runs the eager lanes. This
module writes files only; it makes no decisions.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from string import Template

import hf_rstitch

PACKAGE = Path(__file__).resolve().parent
TEMPLATES = PACKAGE / "templates"

# Flattened in this order: each module only uses names defined above it.
MODULES = (
    "configs.py",
    "core/roles.py",
    "core/guessing.py",
    "core/entropy.py",
    "core/policies.py",
    "core/sampling.py",
    "core/trace.py",
    "core/scheduling.py",
    "core/devices.py",
    "decode/cache_edits.py",
    "decode/lane.py",
    "decode/protocol.py",
    "decode/step.py",
    "decode/emitted.py",
    "decode/loop.py",
    "decode/speculate.py",
    "engine/config.py",
    "engine/pair.py",
    "engine/kv_plan.py",
    "engine/engine.py",
    "hf/output.py",
    "hf/checks.py",
    "hf/placement.py",
    "hf/decode.py",
    "hf/settings.py",
    "hf/entry.py",
)

# Lazy imports of optional parts, and what the template does instead: use an installed
# hf-rstitch if there is one, else say how to get it. (transformers' import check skips `try` blocks.)
OPTIONAL_IMPORTS = {
    "router.policy": ("stitch_router", "the R-Stitch+ router"),
    "fast": ("stitch_engine", "the fast engine"),
    "resources": ("stitch_slm_name_or_path='shipped:...'", "the files shipped with hf-rstitch"),
}

# Same bounds as pyproject.toml (a test checks). transformers reads only the first specifier of a
# custom_generate requirements.txt, so the generated file checks all of them itself when loaded.
REQUIREMENTS = ("torch>=2.4", "transformers>=5.17,<6")

VERSION_CHECK = """

# ---- version bounds, checked when transformers loads this file --------------------------------

TEMPLATE_REQUIREMENTS = $requirements


def _check_versions(requirements=TEMPLATE_REQUIREMENTS):
    from transformers.utils.versions import require_version

    for requirement in requirements:
        require_version(requirement, "This R-Stitch custom_generate template was exported by hf-rstitch $version and "
                                     "tested within these bounds; install a version in range, or re-export the template "
                                     "with a newer hf-rstitch (rstitch export-hub-template DIR).")


_check_versions()
"""

ENTRY_POINT = """

# ---- entry point: transformers calls generate(model=llm, **generate's arguments) -------------

# Written by `rstitch export-hub-template --threshold / --slm / --router`. generate() arguments come
# first, then the LLM's generation config (stitch_threshold, stitch_slm_name_or_path,
# stitch_router_name_or_path), then these.
STITCH_DEFAULTS = $defaults
_ASKS_FOR_STITCHING = ("stitch_threshold", "stitch_policy", "stitch_router", "stitch_slm")


def _wants_stitching(config, kwargs):
    if kwargs.pop("stitch", True) is False:  # generate(..., stitch=False): plain decoding from a repo with defaults
        return False
    return (any(kwargs.get(name) is not None for name in _ASKS_FOR_STITCHING)
            or getattr(config, THRESHOLD_KEY, None) is not None or THRESHOLD_KEY in STITCH_DEFAULTS)


def _fill_defaults(model, config, kwargs):
    import types

    if kwargs.get("stitch_threshold") is None and getattr(config, THRESHOLD_KEY, None) is None:
        kwargs["stitch_threshold"] = STITCH_DEFAULTS.get(THRESHOLD_KEY)
    no_slm = kwargs.get("assistant_model") is None and kwargs.get("stitch_slm") is None
    if no_slm and getattr(config, SLM_KEY, None) is None and SLM_KEY in STITCH_DEFAULTS:
        kwargs["stitch_slm"] = configured_slm(model, types.SimpleNamespace(**{SLM_KEY: STITCH_DEFAULTS[SLM_KEY]}))
    no_route = kwargs.get("stitch_policy") is None and kwargs.get("stitch_router") is None
    if no_route and configured_router(config) is None and ROUTER_KEY in STITCH_DEFAULTS:
        kwargs["stitch_router"] = STITCH_DEFAULTS[ROUTER_KEY]


def generate(*args, model, **kwargs):
    \"\"\"``llm.generate(custom_generate=<this repo>, trust_remote_code=True, ...)``, or any ``generate`` of a
    model loaded with ``from_pretrained(<repo holding this file>, trust_remote_code=True)`` (transformers
    then binds ``model`` by keyword, and the prompt may come positionally).

    Stitches when asked: a ``stitch_threshold`` / ``stitch_policy`` / ``stitch_router`` argument, a
    ``stitch_threshold`` on the generation config, or one in ``STITCH_DEFAULTS``; every other call is
    transformers' own ``generate``, untouched (``stitch=False`` forces that). The SLM is
    ``assistant_model``, else ``stitch_slm``, else the one the generation config or ``STITCH_DEFAULTS``
    names (loaded once). Arguments behave as with ``import hf_rstitch``.
    \"\"\"
    from transformers import GenerationMixin

    kwargs.pop("trust_remote_code", None)
    config = kwargs.get("generation_config") or model.generation_config
    if not _wants_stitching(config, kwargs):
        for name in _ASKS_FOR_STITCHING:
            kwargs.pop(name, None)
        return GenerationMixin.generate(model, *args, **kwargs)
    _fill_defaults(model, config, kwargs)
    if kwargs.get("stitch_engine") is None:  # the fast engine is not in this file: eager lanes unless asked
        kwargs["stitch_engine"] = "default"
    return run_stitched(GenerationMixin.generate, model, args, kwargs)
"""


class ExportError(RuntimeError):
    """The package's sources cannot be flattened (a name defined twice, an import it cannot strip)."""


def _optional_import(module: str, names: list[str], indent: str) -> str:
    arg, what = OPTIONAL_IMPORTS[module]
    body = [
        f"{indent}try:",
        f"{indent}    from hf_rstitch.{module} import {', '.join(names)}",
        f"{indent}except ImportError:",
        f"{indent}    raise ImportError(",
        f'{indent}        "`{arg}` needs {what}, which this custom_generate template does not include: "',
        f'{indent}        "install hf-rstitch (pip install a clone of its repository or a wheel built from one; it is on no "',
        f'{indent}        "package index), then `import hf_rstitch` and drop custom_generate=...."',
        f"{indent}    ) from None",
    ]
    return "\n".join(body)


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                defined.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return defined


def flatten_module(source: str, name: str) -> tuple[str, set[str]]:
    """One module's source with its docstring as a comment and without ``__future__`` or relative imports.

    Relative imports at the top level are dropped (their names are defined earlier in the
    flattened file), and so are those inside functions of a module flattened into the file; other
    relative imports inside functions (optional parts) become a ``try`` of the installed package with
    a clear error. Returns the text and the top-level names it defines.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    replace: dict[int, tuple[int, str | None]] = {}  # first line (0-based) -> (end line, replacement)
    replace.update(_doc_comment(tree))
    defined = _top_level_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.module == "__future__":
            replace[node.lineno - 1] = (node.end_lineno, None)
            continue
        if node.level == 0:
            if (node.module or "").split(".")[0] == "hf_rstitch":
                raise ExportError(f"{name}: absolute import of hf_rstitch.{node.module} cannot be flattened")
            continue
        if any(a.asname for a in node.names):
            raise ExportError(f"{name}:{node.lineno}: `import ... as` in a relative import cannot be flattened")
        top_level = node in tree.body
        if top_level:
            replace[node.lineno - 1] = (node.end_lineno, None)
            continue
        target = (node.module or "").lstrip(".")
        if _flattened(name, node.level, target):  # its names are defined above in the file: nothing to import
            replace[node.lineno - 1] = (node.end_lineno, None)
            continue
        if target not in OPTIONAL_IMPORTS:
            raise ExportError(f"{name}:{node.lineno}: lazy import of .{target} has no template fallback")
        indent = lines[node.lineno - 1][: node.col_offset]
        replace[node.lineno - 1] = (node.end_lineno, _optional_import(target, [a.name for a in node.names], indent))
    return _splice(lines, replace), defined


def _doc_comment(tree: ast.Module) -> dict[int, tuple[int, str | None]]:
    """The module docstring's lines, as :func:`flatten_module`'s ``replace`` holds them, to become a comment (it says
    why the section exists); empty without a docstring."""
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        doc = tree.body[0]
        comment = "\n".join(("# " + line).rstrip() for line in doc.value.value.strip().splitlines())
        return {doc.lineno - 1: (doc.end_lineno, comment)}
    return {}


def _splice(lines: list[str], replace: dict[int, tuple[int, str | None]]) -> str:
    """``lines`` with each ``replace[first] = (end, text)`` span (0-based first line, end exclusive) replaced by
    ``text`` (None: dropped), as one text ending in a newline."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i in replace:
            end, text = replace[i]
            if text is not None:
                out.append(text)
            i = end
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out).strip("\n") + "\n"


def _flattened(name: str, level: int, target: str) -> bool:
    """Whether the relative import ``from {"." * level}{target}`` in module ``name`` (``"engine/engine.py"``)
    names a module of :data:`MODULES`."""
    parts = name.split("/")[:-1]
    parts = parts[:len(parts) - level + 1] if level > 1 else parts
    return "/".join([*parts, *target.split(".")]) + ".py" in MODULES


def flattened_source(defaults: dict | None = None) -> str:
    """The whole ``custom_generate/generate.py``; ``defaults`` become its ``STITCH_DEFAULTS``
    (keys from :data:`hf_rstitch.hf.settings.SETTING_KEYS`)."""
    header = (
        f'"""R-Stitch stitched decoding as a transformers ``custom_generate`` recipe (hf-rstitch '
        f'{hf_rstitch.__version__}).\n\n'
        "Generated by `rstitch export-hub-template` from the hf-rstitch sources; do not edit by hand.\n"
        "Sections, in order: " + ", ".join(m.removesuffix(".py").replace("/", ".") for m in MODULES) + ".\n"
        '"""\n\nfrom __future__ import annotations\n'
    )
    parts = [header, Template(VERSION_CHECK).substitute(requirements=repr(REQUIREMENTS), version=hf_rstitch.__version__)]
    seen: dict[str, str] = {}
    for rel in MODULES:
        text, names = flatten_module((PACKAGE / rel).read_text(encoding="utf-8"), rel)
        clash = {n: seen[n] for n in names if n in seen and not n.startswith("__")}
        if clash:
            raise ExportError(f"{rel} redefines {sorted(clash)} from {sorted(set(clash.values()))}; rename one")
        seen.update({n: rel for n in names})
        parts.append(f"\n# ==== hf_rstitch/{rel} " + "=" * max(4, 84 - len(rel)) + "\n\n" + text)
    parts.append(Template(ENTRY_POINT).substitute(defaults=repr(dict(defaults or {}))))
    source = "\n".join(parts)
    compile(source, "custom_generate/generate.py", "exec")  # a syntax error here is an exporter bug
    return source


def render(template: str, **values) -> str:
    """Fill ``hf_rstitch/templates/<template>`` (``$name`` placeholders); every placeholder must be given."""
    path = TEMPLATES / template
    if not path.is_file():
        known = sorted(p.name for p in TEMPLATES.glob("*.md"))
        raise FileNotFoundError(f"no template {template!r} in {TEMPLATES}; known: {known}")
    try:
        return Template(path.read_text(encoding="utf-8")).substitute(values)
    except KeyError as err:
        raise ValueError(f"template {template} needs a value for {err.args[0]!r}; got {sorted(values)}") from None


def stitch_defaults(threshold: float | None = None, slm: str | None = None, router: str | None = None) -> dict:
    """The template's ``STITCH_DEFAULTS``: only the settings given, validated.

    ``shipped:slm`` is refused: the repo is loaded where hf-rstitch may not be installed, so the reference
    cannot resolve there (a folder given as a path is taken as given: the caller says it exists where the
    repo is loaded). The router needs hf-rstitch wherever it runs, so ``shipped:router`` is kept as ``"shipped"``.
    """
    from .hf.settings import ROUTER_KEY, SLM_KEY, THRESHOLD_KEY, threshold_value
    from .resources import PREFIX

    if slm and str(slm).startswith(PREFIX):
        raise ValueError(
            f"--slm {slm}: the shipped SLM lives inside this install of hf-rstitch, which the machine loading the "
            "repo may not have. Upload the folder hf_rstitch.shipped('slm') to the Hub (hf upload <org>/<slm> "
            "FOLDER) and pass --slm <org>/<slm>, or leave --slm out and pass assistant_model=slm to generate().")
    if router in ("shipped:router",):
        router = "shipped"

    defaults = {THRESHOLD_KEY: None if threshold is None else threshold_value(threshold), SLM_KEY: slm,
                ROUTER_KEY: router}
    return {k: v for k, v in defaults.items() if v not in (None, "")}


def save_llm(llm: str, out: Path) -> None:
    """Save the LLM (and its tokenizer) into ``out``, making the folder a model repo that carries the template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .resources import resolve

    from .sources import check_hub_source

    llm = resolve(llm)
    check_hub_source(llm, "--llm")
    AutoModelForCausalLM.from_pretrained(llm, dtype="auto").save_pretrained(out)
    AutoTokenizer.from_pretrained(llm).save_pretrained(out)


def export(out_dir: str | Path, repo_id: str = "<org>/<repo>", overwrite: bool = False, *,
           threshold: float | None = None, slm: str | None = None, router: str | None = None,
           llm: str | None = None) -> Path:
    """Write the Hub repository template to ``out_dir`` and return it.

    Layout: ``custom_generate/generate.py``, ``custom_generate/requirements.txt``, ``README.md``
    (tagged ``custom_generate``; ``repo_id`` fills its examples) and ``hf_rstitch_export.json``;
    with ``llm``, also that model's weights, configs and tokenizer (a model repo whose ``generate``,
    ``pipeline`` and ``transformers serve`` stitch once loaded with ``trust_remote_code=True``).

    Args:
        out_dir: target folder; created if missing. Must be empty unless ``overwrite``.
        repo_id: the Hub id the folder will be pushed to, used in the README's examples.
        overwrite: replace the files this function writes if they exist.
        threshold: default tau; with it, every ``generate`` through the template stitches.
        slm: the SLM (Hub id, or a folder on the machine that will load the repo), used when a call
            passes no ``assistant_model``.
        router: default R-Stitch+ router (Hub id or folder; needs hf-rstitch where it runs).
        llm: a model (Hub id, folder or ``shipped:llm``) to save into the folder with the template.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder; pass a new or empty folder.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty; pass an empty folder, or overwrite=True (--overwrite) to replace.")
    defaults = stitch_defaults(threshold, slm, router)
    (out / "custom_generate").mkdir(parents=True, exist_ok=True)
    if llm:
        save_llm(llm, out)
    (out / "custom_generate" / "generate.py").write_text(flattened_source(defaults), encoding="utf-8")
    (out / "custom_generate" / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n", encoding="utf-8")
    readme = render("hub_readme.md", repo_id=repo_id, version=hf_rstitch.__version__,
                    requirements=", ".join(f"`{r}`" for r in REQUIREMENTS),
                    defaults=json.dumps(defaults) if defaults else "none (pass `stitch_threshold=` to stitch)")
    (out / "README.md").write_text(readme, encoding="utf-8")
    meta = {"hf_rstitch_version": hf_rstitch.__version__, "modules": list(MODULES), "repo_id": repo_id,
            "stitch_defaults": defaults, "llm": llm}
    (out / "hf_rstitch_export.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out
