"""The layer order of README "Layout", enforced over every import in fp4convert/.

The order is written down once, in the README; this test reads it from there. Every import counts:
at module level, inside functions (lazy imports), under ``if TYPE_CHECKING:``, and
``importlib.import_module("literal")``. Checked:

* every module belongs to a layer the README names;
* nothing imports a layer above its own, nor a sibling on its own line, except the one exception
  the README names (the converter verifies its own output);
* no module imports another package's ``_private`` module or name;
* no import cycle among fp4convert's modules (imports under ``if TYPE_CHECKING:`` never run, so
  they are left out of this one check: they cannot form a cycle);
* no import whose target cannot be read from the source (a computed ``import_module``), except in
  the package root, whose public names are imported lazily by name.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fp4convert"
ROOT = "fp4convert"
#: The one import across siblings the README allows (importer, imported).
EXCEPTIONS = {("convert", "verify")}
EXCEPTION_SENTENCE = "`convert` may import `verify`"


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module name imported
    names: tuple[str, ...]  # names taken from it (``from target import a, b``); () for ``import target``
    line: int
    type_checking: bool

    def where(self) -> str:
        return f"{module_path(self.importer)}:{self.line}"


def module_path(module: str) -> str:
    path = Path(*module.split("."))
    file = REPO / path.with_suffix(".py")
    return str((file if file.exists() else REPO / path / "__init__.py").relative_to(REPO))


def readme_layers() -> list[tuple[str, ...]]:
    """README "Layout": the ```text block of layers, top line highest; ``a | b`` are siblings."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    assert EXCEPTION_SENTENCE in section, f"README Layout no longer says {EXCEPTION_SENTENCE}"
    block = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert block is not None, "README Layout has no ```text block of layers"
    layers = []
    for line in block.group(1).splitlines():
        line = re.sub(r"\(.*?\)", "", line).strip()  # parenthesised notes say what a layer is
        if line:
            layers.append(tuple(part.strip() for part in line.split("|")))
    return layers[::-1]  # bottom first


def all_modules() -> dict[str, Path]:
    modules = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = file.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = file
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _package_of(module: str, modules: dict[str, Path]) -> str:
    """The package a module lives in (a package's ``__init__`` lives in the package itself)."""
    return module if modules[module].name == "__init__.py" else module.rsplit(".", 1)[0]


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, modules: dict[str, Path]) -> None:
        self.module = module
        self.modules = modules
        self.imports: list[Import] = []
        self.hidden: list[int] = []
        self._type_checking = 0

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _add(self, target: str, names: tuple[str, ...], line: int) -> None:
        if target == ROOT or target.startswith(ROOT + "."):
            self.imports.append(Import(self.module, target, names, line, self._type_checking > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, (), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = _package_of(self.module, self.modules).split(".")
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        names = []
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.modules:  # `from pkg import module`: an import of that module
                self._add(submodule, (), node.lineno)
            else:
                names.append(alias.name)
        if names or not node.names:
            self._add(base, tuple(names), node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
        if called in {"import_module", "__import__"}:
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                self._add(argument.value, (), node.lineno)
            else:
                self.hidden.append(node.lineno)
        self.generic_visit(node)


@cache
def collected() -> tuple[tuple[Import, ...], tuple[tuple[str, int], ...]]:
    modules = all_modules()
    imports: list[Import] = []
    hidden: list[tuple[str, int]] = []
    for module, file in modules.items():
        collector = _Collector(module, modules)
        collector.visit(ast.parse(file.read_text(), str(file)))
        imports += collector.imports
        hidden += [(module, line) for line in collector.hidden]
    return tuple(imports), tuple(hidden)


def component(module: str) -> str:
    """``fp4convert.contract.resolve`` -> ``contract``; the package root is ``fp4convert``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def layer_index() -> dict[str, int]:
    return {name: index for index, layer in enumerate(readme_layers()) for name in layer}


def test_every_module_has_a_layer() -> None:
    layers = layer_index()
    missing = sorted({component(m) for m in all_modules()} - set(layers))
    assert not missing, f"modules of {missing} belong to no layer: add them to README Layout"
    stale = sorted(set(layers) - {component(m) for m in all_modules()})
    assert not stale, f"README Layout names layers that do not exist: {stale}"


def test_nothing_imports_upward_or_sideways() -> None:
    layers = layer_index()
    found = []
    for imp in collected()[0]:
        source, target = component(imp.importer), component(imp.target)
        if source == target or (source, target) in EXCEPTIONS:
            continue
        if layers.get(target, -1) >= layers.get(source, -1):
            relation = "a sibling" if layers.get(target) == layers.get(source) else "a layer above"
            found.append(f"{imp.where()}: {imp.importer} imports {imp.target} ({relation}: {target})")
    assert not found, "imports against README Layout:\n" + "\n".join(sorted(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_import_across_packages() -> None:
    modules = all_modules()
    found = []
    for imp in collected()[0]:
        if imp.target not in modules:
            continue  # an unknown target fails the layer test's lookups; nothing private to judge
        importer = _package_of(imp.importer, modules)
        home = _package_of(imp.target, modules)  # the package whose private parts these are
        inside = importer == home or importer.startswith(home + ".")  # the package itself, or below it
        if any(_private(part) for part in imp.target.split(".")[1:]) and not inside:
            found.append(f"{imp.where()}: {imp.importer} imports the private module {imp.target}")
        for name in imp.names:
            if _private(name) and not inside:
                found.append(f"{imp.where()}: {imp.importer} imports the private name {imp.target}.{name}")
    assert not found, "private imports across packages:\n" + "\n".join(sorted(found))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component_ = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component_.append(member)
                        if member == node:
                            break
                    if len(component_) > 1:
                        result.append(sorted(component_))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


def test_no_import_cycles() -> None:
    modules = all_modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for imp in collected()[0]:
        if not imp.type_checking and imp.target in modules and imp.target != imp.importer:
            graph[imp.importer].add(imp.target)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_hidden_imports() -> None:
    hidden = [f"{module_path(m)}:{line}" for m, line in collected()[1] if m != ROOT]
    assert not hidden, "imports whose target is computed, so no layer check can see them:\n" + "\n".join(hidden)


def test_the_checks_see_lazy_imports() -> None:
    """The collector finds imports inside functions and under TYPE_CHECKING (or the tests above prove nothing)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fp4convert.cli import cli\n"
        "def f():\n    from fp4convert.convert import execute\n    import fp4convert.megatron\n"
        "import importlib\nimportlib.import_module('fp4convert.publish')\n"
    )
    modules = {**all_modules(), "fp4convert.formats.probe": PACKAGE / "formats" / "probe.py"}
    collector = _Collector("fp4convert.formats.probe", modules)
    collector.visit(ast.parse(source))
    assert [(i.target, i.type_checking) for i in collector.imports] == [
        ("fp4convert.cli", True),
        ("fp4convert.convert.execute", False),
        ("fp4convert.megatron", False),
        ("fp4convert.publish", False),
    ]
