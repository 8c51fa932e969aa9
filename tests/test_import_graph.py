"""The import graph of mpicoll's own modules: no circles, nothing upward.

Every ``import`` in mpicoll/ is read with ``ast`` - module level and inside
functions alike (an import inside a function is still a dependency, only a
later one) - and checked against the layers of docs/architecture.md's
table, read from it (the one place they are written). A module may import
modules of its own layer or lower ones, never higher ones, and the graph
has no cycle.

Not counted: the implicit import of a module's parent package (Python runs
``mpicoll/algorithms/__init__.py`` before any of its modules: that is the
package's business, and it is why the registry lives outside it), compiled
extensions (``_kernels``, ``_executor_*``) and a script's entry point under
``if __name__ == "__main__":`` (it runs only when the module is the program).
"""
from __future__ import annotations

import ast
import fnmatch
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "mpicoll"

DOC = ROOT.parent / "docs" / "architecture.md"
LAYER_NAMES = ("foundation", "drivers and registry", "state and decisions", "schedules", "plan", "doors", "package",
               "tools and optional parts")


def _layers_from_docs():
    """The layers, lowest first, read from docs/architecture.md's table
    ("| layer | modules | what it knows |"): the one place they are
    written. A row's modules are the backticked names in its second column
    that end in ``.py`` or ``/`` (a subpackage), outside parentheses (those
    describe, they do not place); ``x/*.py`` and ``x/`` place the
    subpackage and everything in it ("x" and "x.*")."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] not in LAYER_NAMES:
            continue
        names = []
        for token in re.findall(r"`([^`]+)`", re.sub(r"\([^()]*\)", "", cells[1])):
            if token == "__init__.py":
                names.append("")
            elif token.endswith(("/", "/*.py")):
                package = token.split("/")[0]
                names += [package, package + ".*"]
            elif token.endswith(".py"):
                names.append(token[:-3])
        rows.append((cells[0], names))
    assert [r[0] for r in rows] == list(LAYER_NAMES), f"{DOC}: the layer table's rows changed: {[r[0] for r in rows]}"
    return tuple(rows)


# Lowest first. A name ending in ".*" covers a subpackage's modules.
LAYERS = _layers_from_docs()


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    return {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _without_main_block(tree: ast.Module) -> ast.Module:
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                         and isinstance(n.test.left, ast.Name) and n.test.left.id == "__name__")]
    return tree


def _imports(name: str, path: pathlib.Path, mods: dict) -> dict:
    """{imported module: line} for the mpicoll modules ``name`` imports."""
    tree = _without_main_block(ast.parse(path.read_text(), str(path)))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "":
        package = []
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name[len("mpicoll."):] if a.name != "mpicoll" else "" for a in node.names
                       if a.name == "mpicoll" or a.name.startswith("mpicoll.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                mod = node.module or ""
                if mod != "mpicoll" and not mod.startswith("mpicoll."):
                    continue
                base = mod[len("mpicoll."):] if mod != "mpicoll" else ""
            else:
                up = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join(up + ([node.module] if node.module else []))
            targets = []
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                if sub in mods:
                    targets.append(sub)  # from . import dtypes: the module
                elif base in mods:
                    targets.append(base)  # from .ops import resolve: the module holding it
        else:
            continue
        for t in targets:
            if t in mods and t != name:
                out.setdefault(t, node.lineno)
    return out


def _layer_of(name: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        for pattern in names:
            if name == pattern or (pattern.endswith(".*") and fnmatch.fnmatch(name, pattern)):
                return i
    raise KeyError(name)


def _graph():
    mods = _modules()
    return mods, {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycle(edges: dict):
    """One cycle as a list of modules, or None."""
    state = {}

    def visit(v, stack):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w, stack)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state:
            found = visit(v, [])
            if found:
                return found
    return None


def _label(m: str) -> str:
    return "mpicoll" + (f".{m}" if m else "")


def test_every_module_has_a_layer():
    missing = [_label(m) for m in _modules() if not _catch(_layer_of, m)]
    assert not missing, f"place these modules in a layer of docs/architecture.md's table: {missing}"


def _catch(fn, *a):
    try:
        fn(*a)
        return True
    except KeyError:
        return False


def test_no_import_circle():
    _, edges = _graph()
    cycle = _cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(_label(m) for m in cycle)


def test_no_upward_import():
    mods, edges = _graph()
    up = []
    for m, targets in sorted(edges.items()):
        for t, line in sorted(targets.items()):
            if _layer_of(t) > _layer_of(m):
                up.append(f"{mods[m].relative_to(ROOT.parent)}:{line}: {_label(m)} ({LAYERS[_layer_of(m)][0]}) "
                          f"imports {_label(t)} ({LAYERS[_layer_of(t)][0]})")
    assert not up, "imports going up the layers:\n" + "\n".join(up)


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """The same checks on a copy of the package with one function-level
    import added that closes a circle and goes up a layer."""
    import shutil

    copy = tmp_path / "mpicoll"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    ops = copy / "ops.py"
    ops.write_text(ops.read_text() + "\n\ndef _late():\n    from .plan import Plan  # noqa\n    return Plan\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    with pytest.raises(AssertionError, match=r"mpicoll\.ops \(foundation\) imports mpicoll\.plan"):
        test_no_upward_import()
    with pytest.raises(AssertionError, match="import circle:.*mpicoll.ops"):
        test_no_import_circle()
