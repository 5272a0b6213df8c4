"""The import structure: one direction, no cycles, no private names across modules, imports on top.

Layers, lowest first (a module may import its own layer and the ones below, never above):

0. core: ``grounding/*.py`` and ``grounding/utils/`` (the config helpers the papers use: ``grounding/stage_config.py``)
1. ``data_modules/``
2. paper packages: ``grounding/vgbert/``, ``grounding/semantic_space/``, ``grounding/composer/``
3. ``grounding/semclip/`` (builds on any VLM, the suite's own included)
4. the top floor, the entry points that run the packages below: the CLI (``grounding/cli.py``, ``python -m grounding``),
   the sweep runner (``grounding/sweep.py``), ``grounding/leaderboard/`` (every model on one test set, COMPOSER's
   split evaluation), ``grounding/explore/`` (the explorer page) and every package's ``__main__``
5. ``benchmarks/``

Read from the source with :mod:`ast` (nothing is imported), so the test also sees imports inside
functions, which must be rare: allowed only with a comment on that line or the line above saying why
(an optional or heavy dependency, a cycle-free lazy CLI import). Modules loaded by name
(``importlib.import_module("<constant>")``) count as imports too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("grounding", "data_modules")
PAPER_PACKAGES = ("vgbert", "semantic_space", "composer")


def _sources() -> dict[str, Path]:
    """Dotted module name -> file, for the suite's packages and the benchmarks."""
    out = {}
    for folder in (*PACKAGES, "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


SOURCES = _sources()


TOP_FLOOR = ("grounding.cli", "grounding.sweep", "grounding.__main__")


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return 5
    if (parts[0] == "grounding" and len(parts) >= 2 and parts[1] in ("leaderboard", "explore")) or \
            module in TOP_FLOOR or parts[-1] == "__main__":
        return 4
    if parts[0] == "data_modules":
        return 1
    if len(parts) >= 2 and parts[1] == "semclip":
        return 3
    if len(parts) >= 2 and parts[1] in PAPER_PACKAGES:
        return 2
    return 0


def _resolve(name: str) -> str | None:
    """The suite module an import names (``from grounding import feature_cache`` names a module)."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


class Import:
    def __init__(self, importer: str, target: str, names: list[str], lineno: int, in_function: bool,
                 commented: bool):
        self.importer, self.target, self.names, self.lineno = importer, target, names, lineno
        self.in_function, self.commented = in_function, commented

    def __repr__(self):
        return f"{SOURCES[self.importer].relative_to(ROOT)}:{self.lineno} imports {self.target} {self.names or ''}"


def _imports(module: str, text: str | None = None) -> list[Import]:
    """The suite imports of ``module`` (its source file, or ``text`` given as its source)."""
    path = SOURCES[module]
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    tree = ast.parse(text)
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and child.level:  # relative: from the importer's package
                    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{child.module}" if child.module else package
                else:
                    base = child.module if isinstance(child, ast.ImportFrom) else None
                names = [a.name for a in child.names]
                targets = ([f"{base}.{n}" if f"{base}.{n}" in SOURCES else base for n in names] if base
                           else names)
                line = lines[child.lineno - 1]
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                commented = "#" in line or above.startswith("#")
                for target in dict.fromkeys(targets):
                    resolved = _resolve(target)
                    if resolved and resolved.split(".")[0] in (*PACKAGES, "benchmarks") and resolved != module:
                        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                        found.append(Import(module, resolved, private, child.lineno, in_function, commented))
            elif (isinstance(child, ast.Call) and getattr(child.func, "attr", getattr(child.func, "id", None))
                  == "import_module" and child.args and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str)):  # a module loaded by its name
                resolved = _resolve(child.args[0].value)
                if resolved and resolved.split(".")[0] in (*PACKAGES, "benchmarks") and resolved != module:
                    found.append(Import(module, resolved, [], child.lineno, in_function, True))
            visit(child, nested)

    visit(tree, False)
    return found


ALL_IMPORTS = [imp for module in SOURCES for imp in _imports(module)]


def test_the_scan_sees_the_suite():
    assert {"grounding.lightning", "data_modules.base", "grounding.vgbert.pretrain",
            "grounding.semclip.vlm"} <= set(SOURCES)
    assert any(i.importer == "grounding.vgbert.pretrain" and i.target == "grounding.lightning" for i in ALL_IMPORTS)
    assert layer("grounding.retrieval_training") == 0 and layer("grounding.utils.io") == 0
    assert layer("data_modules.wordnet_lists") == 1 and layer("grounding.composer.crg_extraction") == 2
    assert layer("grounding.semclip.alignment_data") == 3 and layer("benchmarks.bench_vgbert") == 5
    assert layer("grounding.leaderboard.board") == 4 and layer("grounding.cli") == 4 and layer("grounding.sweep") == 4
    assert layer("grounding.composer.__main__") == 4 and layer("grounding.stage_config") == 0


def test_the_cli_imports_every_stage_package_by_name_in_its_source():
    """The CLI selects stages by class name, so it imports their packages, explicitly (the top floor sees them)."""
    import data_modules

    targets = {i.target for i in ALL_IMPORTS if i.importer == "grounding.cli"}
    assert {f"data_modules.{m}" for m in data_modules.DATAMODULE_MODULES} | {"grounding.vgbert", "grounding.semclip"} <= targets
    assert not [i for i in ALL_IMPORTS if i.target == "grounding.cli" and layer(i.importer) < 4]


def test_a_module_loaded_by_name_is_seen():
    """``importlib.import_module("grounding.cli")`` in a paper module is an upward import like any other."""
    source = 'import importlib\n\n\ndef load():\n    return importlib.import_module("grounding.cli")\n'
    found = _imports("grounding.composer.crg_extraction", source)
    assert [(i.target, i.in_function) for i in found] == [("grounding.cli", True)]
    assert layer(found[0].target) > layer(found[0].importer)


def test_imports_point_down_the_layers():
    upward = [i for i in ALL_IMPORTS if layer(i.target) > layer(i.importer)]
    assert not upward, "imports from a higher layer (data below models; see the module docstring):\n" + \
        "\n".join(map(repr, upward))


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in SOURCES}
    for i in ALL_IMPORTS:
        # A package's __init__ re-exporting its own modules is not a dependency of those modules on it.
        if not i.target.startswith(i.importer + "."):
            graph[i.importer].add(i.target)
    cycles, state, stack = [], {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    private = [i for i in ALL_IMPORTS if i.names]
    assert not private, "private names imported from another module (make them public or move them):\n" + \
        "\n".join(map(repr, private))


def test_suite_imports_sit_at_the_top_of_files():
    hidden = [i for i in ALL_IMPORTS if i.in_function and not i.commented]
    assert not hidden, ("suite imports inside functions without a comment saying why (move them to the top, "
                        "or comment the reason: an optional/heavy dependency):\n" + "\n".join(map(repr, hidden)))


@pytest.mark.parametrize("bad", ["data_modules.synthetic -> grounding.semclip.vlm",
                                 "grounding.utils.io -> grounding.vgbert.pretrain",
                                 "grounding.composer.cost -> grounding.cli",
                                 "grounding.stage_config -> grounding.cli"])
def test_the_direction_check_can_fail(bad):
    importer, target = bad.split(" -> ")
    assert layer(target) > layer(importer)
