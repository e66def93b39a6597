"""The package's modules import each other without cycles, and the layers stay in order.

Every module under src/rltune is parsed (no import runs): each `import` / `from ... import`, at
module level or inside a function (a function-level import that only dodges a cycle is still that
cycle), is an edge to the deepest rltune module it names (`from rltune.recipe import rules_algo`
-> rltune.recipe.rules_algo; `from rltune.plan import estimate` -> rltune.plan.estimate when that is
a module, else rltune.plan). Imports under `if TYPE_CHECKING:` never run and do not count. A
package's own __init__ loading its submodules is no cycle: the implicit import of a parent package
is not an edge.

Layers: the recipe's schema and loader at the bottom, the memory plan (rltune.plan) above the
schema, the lint rules (rltune.recipe.rules*) above both: rules_base.py holds the registry and
helpers the rule modules share, rules.py gathers the rule modules. In data/, rows.py (the row
checks and DataError) is below the sources: hub.py (`hf:`) below datasets.py (files, builtin tasks
and the `load_prompts` dispatch).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "rltune"

# cycles that are another change's to break (each entry names what is left to do); remove an entry
# once its cycle is gone, and the test keeps it from coming back
PENDING: dict = {}   # cycles known and owned elsewhere (none left)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking(node: ast.AST) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if not _type_checking(child):
                stack.append(child)


def _deepest(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def edges(module: str) -> dict[str, int]:
    """{imported rltune module: the line of its first import} for `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [_deepest(a.name) for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append(sub if sub in MODULES else _deepest(base))
        for t in targets:
            if t is not None and t != module and t.startswith("rltune"):
                out.setdefault(t, node.lineno)
    return out


GRAPH = {m: edges(m) for m in MODULES}


def cycles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(GRAPH[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _loop_in(comp: list[str]) -> str:
    """One import loop through the component, with file and line of each import."""
    members = set(comp)
    start = comp[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(t for t in GRAPH[path[-1]] if t in members)
        back = start if start in nxt else None
        step = back or next((t for t in nxt if t not in seen), nxt[0])
        path.append(step)
        if step in seen:
            path = path[path.index(step):]
            break
        seen.add(step)
    lines = [f"  {a} ({MODULES[a].relative_to(SRC.parent)}:{GRAPH[a][b]}) imports {b}" for a, b in zip(path, path[1:])]
    return "\n".join(lines)


def test_the_module_graph_is_parsed():
    # a sanity check on the parser: known edges are found, function-level ones included
    assert "rltune.recipe.schema" in GRAPH["rltune.recipe.rules_base"]
    assert "rltune.plan" in GRAPH["rltune.recipe.rules_memory"]          # inside a function
    assert "rltune.recipe.rules_algo" in GRAPH["rltune.recipe.rules"]    # `from rltune.recipe import rules_algo`
    assert "rltune.data.rows" in GRAPH["rltune.data.hub"]                # `from .rows import ...`


def test_no_import_cycles():
    found = [c for c in cycles() if frozenset(c) not in PENDING]
    msg = "\n\n".join(f"import cycle between {', '.join(c)}:\n{_loop_in(c)}" for c in found)
    assert not found, msg


def test_pending_cycles_are_only_what_they_say():
    # an entry may disappear (fixed), but must not grow into a bigger cycle
    for comp in cycles():
        grown = [p for p in PENDING if p < frozenset(comp)]
        assert not grown, f"a pending cycle grew: {', '.join(comp)}\n{_loop_in(comp)}"


def _imports_of(prefix: str) -> dict[str, dict[str, int]]:
    return {m: GRAPH[m] for m in GRAPH if m == prefix or m.startswith(prefix + ".")}


def test_the_plan_sits_below_the_lint_rules():
    bad = [f"{m} imports {t} (line {ln})" for m, ts in _imports_of("rltune.plan").items()
           for t, ln in ts.items() if t.startswith("rltune.recipe.rules")]
    assert not bad, "rltune.plan must not import the lint rules (they read the plan):\n" + "\n".join(bad)


def test_rule_modules_share_the_registry_of_rules_base():
    # rules.py gathers the rule modules; they take the registry and helpers from rules_base.py
    for m in ("rltune.recipe.rules_algo", "rltune.recipe.rules_memory"):
        assert "rltune.recipe.rules" not in GRAPH[m], f"{m} imports rltune.recipe.rules: use rules_base"
    assert not any(t.startswith("rltune.recipe.rules") for t in GRAPH["rltune.recipe.rules_base"])


def test_data_sources_sit_below_the_dispatch():
    assert "rltune.data.datasets" not in GRAPH["rltune.data.hub"]
    assert not any(t.startswith("rltune.data.") for t in GRAPH["rltune.data.rows"])
