"""The import structure: one direction, no cycles, no private names across modules, imports on top.

Layers, lowest first (a module may import its own layer and the ones below, never above):

0. core: ``grounding/*.py`` and ``grounding/utils/`` (the config helpers the papers use: ``grounding/stage_config.py``)
1. ``data_modules/``
2. paper packages: ``grounding/vgbert/``, ``grounding/semantic_space/``, ``grounding/composer/``
3. ``grounding/semclip/`` (builds on any VLM, the suite's own included)
4. the top floor, the entry points that run the packages below: the CLI (``grounding/cli.py``, ``python -m grounding``),
   the sweep runner (``grounding/sweep.py``), ``grounding/leaderboard/`` (every model on one test set, COMPOSER's
   split evaluation), ``grounding/explore/`` (the explorer page); a package's ``__main__`` is on its package's
   floor (the composer command starts the split evaluation of the top floor as a process, never imports it)
5. ``benchmarks/``

Read from the source with :mod:`ast` (nothing is imported), so the test also sees imports inside
functions, which must be rare: allowed only with a comment on that line or the line above saying why
(an optional or heavy dependency, a cycle-free lazy CLI import). Modules loaded by name
(``importlib.import_module("<constant>")``) count as imports too.

The same scan keeps every function (methods and nested functions included) at most ``MAX_FUNCTION_LINES`` long,
counted from its ``def`` line to its last line: a longer one is split into named helpers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("grounding", "data_modules")
MAX_FUNCTION_LINES = 100
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
            module in TOP_FLOOR:
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
    assert layer("grounding.composer.__main__") == 2 and layer("grounding.semclip.__main__") == 3
    assert layer("grounding.leaderboard.__main__") == 4 and layer("grounding.stage_config") == 0


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


def long_functions(text: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``where:function (N lines)`` for each function of the source ``text`` longer than ``limit`` lines (``def``
    line to last line, as ``ast`` numbers them; decorators not counted)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n_lines = node.end_lineno - node.lineno + 1
            if n_lines > limit:
                found.append(f"{where}:{node.name} ({n_lines} lines)")
    return found


def test_no_function_over_100_lines():
    too_long = [f for path in SOURCES.values()
                for f in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not too_long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into helpers named for what they "
                          "compute):\n" + "\n".join(too_long))


def test_the_length_check_can_fail():
    """A method of 101 lines is named with its length; one of 100 lines, a short function, or a limit above is not."""
    body = "".join(f"        x{i} = {i}\n" for i in range(100))
    source = f"def short():\n    return 1\n\n\nclass Model:\n    @property\n    def long(self):\n{body}"
    assert long_functions(source, "m.py") == ["m.py:long (101 lines)"]
    assert long_functions(source, "m.py", limit=101) == []
    assert long_functions(source.replace("        x99 = 99\n", ""), "m.py") == []


MAX_CONSTRUCTOR_ARGUMENTS = 15


def wide_constructors(text: str, where: str, limit: int = MAX_CONSTRUCTOR_ARGUMENTS) -> list[str]:
    """``where:Class.__init__ (N args)`` for each class of the source ``text`` whose ``__init__`` takes more than
    ``limit`` arguments (``self`` not counted; ``*args`` / ``**kwargs`` count one each)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        for init in node.body:
            if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)) and init.name == "__init__":
                a = init.args
                n_args = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg) - 1
                if n_args > limit:
                    found.append(f"{where}:{node.name}.__init__ ({n_args} args)")
    return found


def test_no_constructor_over_15_arguments():
    """A class with more switches groups them by concern into option dataclasses (a DataModule's ``transform`` /
    ``loader`` / ``subsets``: data_modules/options.py; a network's ``sizes``; a model's ``losses``)."""
    too_wide = [c for path in SOURCES.values()
                for c in wide_constructors(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not too_wide, (f"constructors over {MAX_CONSTRUCTOR_ARGUMENTS} arguments (group the options that belong "
                          "together into an option dataclass, docs/configs.md \"Option groups\"):\n" + "\n".join(too_wide))


def test_the_constructor_check_can_fail():
    """16 arguments besides ``self`` are named with their count (keyword-only and ``**kwargs`` included); 15 are not,
    nor is a method other than ``__init__`` or a function outside a class."""
    args = ", ".join(f"a{i}" for i in range(14))
    source = (f"class Wide:\n    def __init__(self, {args}, *, k=1, **kw):\n        pass\n\n    def run(self, {args}, x, y):\n"
              f"        pass\n\n\nclass Fine:\n    def __init__(self, {args}, k=1):\n        pass\n\n\n"
              f"def __init__({args}, x, y, z):\n    pass\n")
    assert wide_constructors(source, "m.py") == ["m.py:Wide.__init__ (16 args)"]
    assert wide_constructors(source, "m.py", limit=16) == []
