"""docs/architecture.md's table of packages is the law of the imports: each may import only what it lists.

Read from the source (no import runs): every ``django_outbox`` import of every module, lazy ones too, is
an arrow from its package to another; an arrow the table does not list fails. And no two modules import
each other at import time, directly or round a longer circle (imports inside functions and under
``TYPE_CHECKING`` run later, or never, so they cannot close one).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

from tests.support import ROOT

PACKAGE = ROOT / "django_outbox"
PAGE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(?P<unit>[\w./]+)` \| (?P<owns>.*?) \| (?P<imports>.*?) \|$", re.M)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    """``django_outbox.store.claiming`` -> ``store``; ``django_outbox.api`` -> ``api``; the root -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@functools.cache
def sources() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def imports(path: Path, module: str, *, at_import_time: bool) -> set[str]:
    """The django_outbox modules ``module`` imports (a name imported from a package counts as its module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    known = sources()
    found: set[str] = set()

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            if at_import_time and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if at_import_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(list(node.orelse))
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                if base.startswith("django_outbox"):
                    for alias in node.names:
                        candidate = f"{base}.{alias.name}"
                        found.add(candidate if candidate in known else base)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("django_outbox"))
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([c for c in children if isinstance(c, ast.stmt | ast.ExceptHandler)])

    visit(list(tree.body))
    return found


def allowed() -> dict[str, set[str]]:
    table = {}
    for row in ROW.finditer(PAGE.read_text(encoding="utf-8")):
        unit = row["unit"].strip("/").removeprefix("django_outbox").strip(".") or "__init__"
        table[unit] = set(re.findall(r"`([\w.]+)/?`", row["imports"]))
    return table


def test_the_table_names_every_package_and_module() -> None:
    units = {unit_of(m) for m in sources()}
    assert set(allowed()) == units, "docs/architecture.md's table and django_outbox/ disagree on what exists"


def test_each_package_imports_only_what_the_table_lets_it() -> None:
    table = allowed()
    broken = []
    for module, path in sources().items():
        for target in imports(path, module, at_import_time=False):
            source, dest = unit_of(module), unit_of(target)
            if source != dest and dest not in table.get(source, set()):
                broken.append(f"{module} imports {target}: `{dest}` is not in the row of `{source}`")
    assert not broken, "\n".join(sorted(broken))


def test_the_table_lists_no_import_that_is_not_there() -> None:
    """Else the table would allow more and more, and say less and less."""
    used: dict[str, set[str]] = defaultdict(set)
    for module, path in sources().items():
        for target in imports(path, module, at_import_time=False):
            if unit_of(module) != unit_of(target):
                used[unit_of(module)].add(unit_of(target))
    stale = {unit: sorted(listed - used[unit]) for unit, listed in allowed().items() if listed - used[unit]}
    assert not stale, f"docs/architecture.md allows imports nothing makes: {stale}"


def owns() -> dict[str, str]:
    return {
        row["unit"].strip("/").removeprefix("django_outbox").strip(".") or "__init__": row["owns"]
        for row in ROW.finditer(PAGE.read_text(encoding="utf-8"))
    }


def test_each_row_names_every_module_of_its_package():
    """A module the table does not name has no stated job, and a newcomer would not look for it there."""
    cells = owns()
    unnamed = []
    for module, path in sources().items():
        parts = module.split(".")
        if len(parts) < 3 or path.name == "__init__.py":
            continue
        if f"`{parts[-1]}`" not in cells[parts[1]]:
            unnamed.append(module)
    assert not unnamed, f"docs/architecture.md's rows do not name these modules (in backticks): {sorted(unnamed)}"


#: In the flow: ``store.claiming.claim()``, ``worker.keeper.Keeper.keep()``, ``worker.doorbell``.
_FLOW_NAME = re.compile(r"\b([a-z_]+(?:\.[A-Za-z_]\w*)+)(?=\(|\b)")


def flow_names() -> set[str]:
    text = PAGE.read_text(encoding="utf-8").split("## The flow of one message", 1)[1].split("\n## ", 1)[0]
    block = text.split("```", 2)[1]
    block = re.sub(r"\n\s*│?\s+\.", ".", block)  # ``BaseTransport\n  .deliver()`` wrapped onto two lines
    units = {unit_of(m) for m in sources()}
    return {name for name in _FLOW_NAME.findall(block) if name.split(".")[0] in units}


def defined_names(node: ast.AST) -> set[str]:
    """What a statement defines: a function's or class's name, or the names a module-level assignment binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    return set()


def test_the_flow_of_one_message_names_functions_that_exist():
    """Each ``package.module.function`` the flow names is defined there (read from the source, no import)."""
    names = flow_names()
    assert {"store.claiming.claim", "worker.pipeline.Pipeline.process", "api.Outbox.send"} <= names
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(["django_outbox", *parts[:cut]])
            if module in sources():
                break
        else:
            missing.append(name)
            continue
        rest = parts[cut:]
        tree: ast.AST = ast.parse(sources()[module].read_text(encoding="utf-8"))
        for attr in rest:
            found = next((n for n in getattr(tree, "body", []) if attr in defined_names(n)), None)
            if found is None:
                missing.append(name)
                break
            tree = found
    assert not missing, f"docs/architecture.md's flow names what the code does not define: {missing}"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of two or more nodes that reach each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = {m: imports(p, m, at_import_time=True) - {m} for m, p in sources().items()}
    assert not circles(graph), f"modules importing each other at import time: {circles(graph)}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A circle is found, and lazy or type-only imports are told apart from import-time ones."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    scratch = tmp_path / "scratch.py"
    scratch.write_text(
        "from django_outbox import store\n"
        "def f():\n    from django_outbox import worker\n"
        "if TYPE_CHECKING:\n    from django_outbox import admin\n"
    )
    assert imports(scratch, "django_outbox.scratch", at_import_time=True) == {"django_outbox.store"}
    assert imports(scratch, "django_outbox.scratch", at_import_time=False) == {
        "django_outbox.store",
        "django_outbox.worker",
        "django_outbox.admin",
    }
