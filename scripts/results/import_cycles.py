"""Modules of mmrl (``mmrl/``, ``tasks/`` as ``mmrl.tasks``, ``envs/`` as ``mmrl.envs``) that sit in import
cycles, counting every import statement, lazy (in-function) ones included.

    python scripts/results/import_cycles.py [ROOT]      # ROOT: a checkout (default: this one)

Prints the number of modules in cycles, the largest cycle's size and each cycle (strongly connected
component of the import graph). ``tests/test_architecture_doc.py`` keeps the count at 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = {"mmrl": ("mmrl",), "tasks": ("mmrl", "tasks"), "envs": ("mmrl", "envs")}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    parts = [*PACKAGES[parts[0]], *parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for top in PACKAGES for p in (root / top).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in files:  # the module that defines the imported name
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on_stack, found = [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    found = cycles(import_graph(root))
    print(f"modules in import cycles: {sum(map(len, found))}; largest cycle: {max(map(len, found), default=0)}")
    for component in found:
        print("  " + ", ".join(component))


if __name__ == "__main__":
    main()
