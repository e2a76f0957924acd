"""Rooted containment trees for CurveBench (arXiv 2605.14068): sampling, canonical forms, the answer
parser and the tree reward.

A tree over ``n`` curves has nodes ``0..n``: node 0 is the unbounded outer region (the virtual
root), node ``i ≥ 1`` the inside of curve ``i``; an edge ``(parent, child)`` says the child region
lies directly inside the parent. Trees are stored as a ``parents`` tuple: ``parents[i - 1]`` is
the parent of node ``i``. Trees built here are in *canonical* numbering (breadth first, children
in sorted AHU order), so one topology always gives the same answer text.

Answer format and parse follow the published reward (seed_tasks.md §2.2-2.3): inside
``<answer>…</answer>`` the first non-empty line is the number of curves, each later line ``u v``
an edge from parent ``v`` to child ``u``; unparsable edge lines are skipped; an unparsable count
line fails the whole parse.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx
import numpy as np

from mmrl.tasks.parsing import parse_int, tag_blocks, text_problem

Parents = tuple[int, ...]
Edge = tuple[int, int]  # (parent, child)

EDGE_LINE = re.compile(r"^\s*(-?\d+)\s+(-?\d+)\s*$")
COUNT_LINE = re.compile(r"^\s*(-?\d+)\s*$")
THINK_ANSWER = re.compile(r"\s*<think>(?:(?!<think>|</think>).)*</think>\s*<answer>(?:(?!<answer>).)*?</answer>\s*",
                          re.DOTALL)


# ------------------------------------------------------------------------------------------------
# Trees and canonical forms


def edges_of(parents: Parents) -> tuple[Edge, ...]:
    return tuple((p, i) for i, p in enumerate(parents, start=1))


def children_map(edges: Sequence[Edge]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    return children


def rooted_canonical(edges: Sequence[Edge], root: int = 0) -> str:
    """AHU canonical string of the tree rooted at ``root`` (Aho, Hopcroft & Ullman 1974): a node
    is ``(`` + its children's strings in sorted order + ``)``; two rooted unordered trees are
    isomorphic iff their strings are equal. Iterative, so deep chains do not hit recursion limits.

    >>> rooted_canonical([(0, 1), (0, 2), (2, 3)]) == rooted_canonical([(0, 2), (2, 1), (0, 3)])
    True
    >>> rooted_canonical([(0, 1), (1, 2)]) == rooted_canonical([(1, 0), (1, 2)], root=0)
    False
    """
    children = children_map(edges)
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(children.get(node, ()))
    code: dict[int, str] = {}
    for node in reversed(order):
        code[node] = "(" + "".join(sorted(code[c] for c in children.get(node, ()))) + ")"
    return code[root]


def canonical_parents(edges: Sequence[Edge]) -> Parents:
    """Renumber a rooted tree (root 0) breadth first, children in sorted AHU order: the same
    topology always gives the same ``parents`` tuple."""
    children = children_map(edges)
    codes: dict[int, str] = {}

    def code(node: int) -> str:
        if node not in codes:
            codes[node] = "(" + "".join(sorted(code(c) for c in children.get(node, ()))) + ")"
        return codes[node]

    code(0)
    new_id, parents, queue = {0: 0}, [], [0]
    for node in queue:
        for child in sorted(children.get(node, ()), key=code):
            new_id[child] = len(new_id)
            parents.append(new_id[node])
            queue.append(child)
    return tuple(parents)


@lru_cache(maxsize=None)
def all_topologies(num_curves: int) -> tuple[Parents, ...]:
    """Every rooted unlabeled tree with ``num_curves`` non-root nodes, canonical, sorted
    (1, 1, 2, 4, 9, 20, 48 for 0..6 curves: OEIS A000081 shifted)."""
    if not 0 <= num_curves <= 8:
        raise ValueError(f"all_topologies enumerates 0..8 curves, got {num_curves}")
    found = set()
    # Every rooted tree has a numbering with parent < child: enumerate those parent choices.
    for choice in itertools.product(*[range(i) for i in range(1, num_curves + 1)]):
        found.add(canonical_parents(edges_of(tuple(choice))))
    return tuple(sorted(found))


def depth_of(parents: Parents) -> int:
    depth = [0]
    for i, p in enumerate(parents, start=1):
        depth.append(depth[p] + 1 if p < i else 0)
    return max(depth)


def random_recursive_tree(num_curves: int, max_depth: int, rng: np.random.Generator) -> Parents:
    """Each new curve goes inside a uniformly chosen existing region whose depth is below ``max_depth``."""
    depth, parents = [0], []
    for _ in range(num_curves):
        allowed = [i for i, d in enumerate(depth) if d < max_depth]
        parent = allowed[int(rng.integers(len(allowed)))]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return canonical_parents(edges_of(tuple(parents)))


# ------------------------------------------------------------------------------------------------
# Answers


def answer_text(parents: Parents) -> str:
    """The published answer body: the count, then one ``child parent`` line per edge."""
    return "\n".join([str(len(parents)), *(f"{child} {parent}" for parent, child in edges_of(parents))])


@dataclass(frozen=True)
class ParsedAnswer:
    count: int
    edges: tuple[Edge, ...]  # (parent, child), in answer order, duplicates kept
    skipped_lines: int


def parse_answer(output: str) -> ParsedAnswer | None:
    """The published parser (first ``<answer>`` block, tags in any case; count line; ``u v`` → edge
    ``(v, u)``); None when there is no block or the first non-empty line is not an integer. Integers
    of more than 18 digits read as ±10^18 (:func:`~mmrl.tasks.parsing.parse_int`): a wrong count, an
    id outside the tree. The caller caps the output's length (:func:`judge`)."""
    blocks = tag_blocks(output, "answer", ignore_case=True)
    if not blocks:
        return None
    lines = [line for line in blocks[0].splitlines() if line.strip()]
    if not lines or (count := COUNT_LINE.match(lines[0])) is None:
        return None
    edges, skipped = [], 0
    for line in lines[1:]:
        edge = EDGE_LINE.match(line)
        if edge is None:
            skipped += 1
        else:
            edges.append((parse_int(edge.group(2)), parse_int(edge.group(1))))
    return ParsedAnswer(parse_int(count.group(1)), tuple(edges), skipped)


def rooted_tree_problem(edges: Sequence[Edge]) -> str:
    """Why ``edges`` are not a tree on nodes ``0..len(edges)`` rooted at 0, or "" when they are.

    Strict on purpose (hacking probes): self loops, duplicated edges, a node with two parents,
    ids outside ``0..len(edges)``, a parent of the root, and cycles/unreachable nodes all fail.
    """
    m = len(edges)
    if m == 0:
        return "no edges"
    if any(p == c for p, c in edges):
        return "self loop"
    if len(set(edges)) < m:
        return "duplicated edge"
    if any(not (0 <= p <= m and 0 <= c <= m) for p, c in edges):
        return f"node id outside 0..{m}"
    kids = [c for _, c in edges]
    if 0 in kids:
        return "the root 0 has a parent"
    if len(set(kids)) < m:
        return "a node has two parents"
    reached, stack, children = {0}, [0], children_map(edges)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in reached:
                reached.add(child)
                stack.append(child)
    return "" if len(reached) == m + 1 else "cycle or node not reachable from the root 0"


def unrooted_isomorphic(pred: Sequence[Edge], truth: Sequence[Edge]) -> bool:
    """The published check: ``networkx.is_isomorphic`` of the undirected graphs after equal node and
    edge counts. It ignores the root (a re-rooted tree passes) and collapses duplicated edges."""
    if not pred or not truth:
        return not pred and not truth
    a, b = nx.Graph(list(pred)), nx.Graph(list(truth))
    if a.number_of_nodes() != b.number_of_nodes() or a.number_of_edges() != b.number_of_edges():
        return False
    return bool(nx.is_isomorphic(a, b))


@dataclass(frozen=True)
class TreeVerdict:
    tree: float  # rooted isomorphism (root 0 pinned): the default reward
    tree_unrooted: float  # the published unrooted check, reported for comparability
    node_count: float  # count line equals the number of curves
    format: float  # exactly one <think>…</think> then one <answer>…</answer>
    info: str


def judge(output: object, truth: Parents) -> TreeVerdict:
    """Score an output against the true tree; total for any input (never raises). Outputs longer than
    :data:`~mmrl.tasks.parsing.MAX_OUTPUT_CHARS` score 0 unparsed."""
    if problem := text_problem(output):
        return TreeVerdict(0.0, 0.0, 0.0, 0.0, problem)
    fmt = float(THINK_ANSWER.fullmatch(output) is not None)
    parsed = parse_answer(output)
    if parsed is None:
        return TreeVerdict(0.0, 0.0, 0.0, fmt, "no <answer> block whose first line is the curve count")
    true_edges = edges_of(truth)
    count = float(parsed.count == len(truth))
    unrooted = float(unrooted_isomorphic(parsed.edges, true_edges))
    problem = rooted_tree_problem(parsed.edges)
    rooted = float(not problem and rooted_canonical(parsed.edges) == rooted_canonical(true_edges))
    if problem:
        info = f"not a tree rooted at 0: {problem}"
    elif not rooted:
        info = f"wrong tree ({len(parsed.edges)} curves; {len(truth)} expected)"
    elif not fmt:
        info = "right tree, but not exactly <think>…</think><answer>…</answer>"
    else:
        info = ""
    return TreeVerdict(rooted, unrooted, count, fmt, info)
