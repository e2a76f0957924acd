"""Tools a ``data/rows-v0`` answer may call (``task.args.tools``, trained with ``algo.tool_turns``).

A call is written ``<tool>name(arguments)</tool>`` anywhere in an answer; :func:`find_call` reads it and
:func:`run_tool` answers it with a string. Both are total: a malformed call, an unknown tool or arguments the
tool refuses give an ``error: ...`` string (the policy reads it as the tool's result, as it would any other),
never an exception. A tool is a plain function ``str -> str`` in :data:`TOOLS`. The error strings use only letters,
digits, spaces, ``.,:()<>/=+-*`` and the text of the call itself, so a character-level vocabulary that can write
calls (``configs/data/tool_tiny_cpu.yaml``) can read them.

>>> calc("7+3"), calc("(2+4)*3/4"), calc("2**100")
('10', '4.5', 'error: only + - * / on integers (found Pow)')
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from fractions import Fraction

from mmrl.core.registry import Registry

CALL_OPEN, CALL_CLOSE = "<tool>", "</tool>"
CALL_PATTERN = re.compile(r"<tool>\s*([A-Za-z_]\w*)\((.*?)\)\s*</tool>", re.DOTALL)

Tool = Callable[[str], str]
TOOLS: Registry[Tool] = Registry("tool")

CALC_MAX_CHARS = 64
"""Longest expression :func:`calc` reads (bounds the parse's work and nesting)."""
CALC_MAX_ABS = 10 ** 12
"""Largest magnitude of any number :func:`calc` reads or computes, intermediate results included."""
CALC_DECIMALS = 6
"""Places a non-integer result is rounded to."""


class CalcRefused(ValueError):
    """An expression :func:`calc` does not evaluate; the message is what the caller is told."""


def calc(expression: str) -> str:
    """A safe arithmetic evaluator: integers with ``+ - * /``, unary minus and parentheses, parsed with
    :mod:`ast` (never ``eval``), computed exactly with fractions. Integer results are written as integers,
    others rounded to :data:`CALC_DECIMALS` places. Names, attributes, calls, powers, floats, division by zero,
    expressions longer than :data:`CALC_MAX_CHARS` and numbers beyond :data:`CALC_MAX_ABS` give ``error: ...``.

    >>> calc("12 - 20"), calc("-(3)"), calc("1/3"), calc("7/0")
    ('-8', '-3', '0.333333', 'error: division by zero')
    """
    if len(expression) > CALC_MAX_CHARS:
        return f"error: expression longer than {CALC_MAX_CHARS} characters"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return "error: not an arithmetic expression"
    try:
        value = _evaluate(tree.body)
    except CalcRefused as refusal:
        return f"error: {refusal}"
    return format_number(value)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:  # bool is an int subclass: refused
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right)
        if right == 0:
            raise CalcRefused("division by zero")
        return _bounded(left / right)
    if isinstance(node, ast.Name):
        raise CalcRefused(f"unknown name {node.id}")
    if isinstance(node, ast.Attribute):
        raise CalcRefused("attribute access is not allowed")
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise CalcRefused(f"only + - * / on integers (found {what})")


def _bounded(value: Fraction) -> Fraction:
    # Both parts are bounded: a quotient's denominator can otherwise grow with every division.
    if abs(value) > CALC_MAX_ABS or value.denominator > CALC_MAX_ABS:
        raise CalcRefused(f"number beyond {CALC_MAX_ABS:.0e}")
    return value


def format_number(value: Fraction) -> str:
    """An integer as an integer; otherwise rounded to :data:`CALC_DECIMALS` places, trailing zeros dropped."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(round(value, CALC_DECIMALS)):.{CALC_DECIMALS}f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


TOOLS.register("calc", calc)


def holds_call(output: str) -> bool:
    """Whether ``output`` tries to call a tool (it opens a ``<tool>`` tag, well-formed or not)."""
    return CALL_OPEN in output


def find_call(output: str) -> tuple[str, str] | str:
    """The first call of ``output`` as (tool name, arguments), or an ``error: ...`` string for a malformed one.

    >>> find_call("<tool>calc(7+3)</tool>"), find_call("<tool>calc 7+3</tool>")
    (('calc', '7+3'), 'error: malformed call, write <tool>name(arguments)</tool>')
    """
    match = CALL_PATTERN.search(output)
    if match is None:
        return f"error: malformed call, write {CALL_OPEN}name(arguments){CALL_CLOSE}"
    return match.group(1), match.group(2)


def run_tool(output: str, allowed: tuple[str, ...]) -> str:
    """The result of the call in ``output`` (which :func:`holds_call`) by one of the ``allowed`` tools; an
    ``error: ...`` string for a malformed call or a tool that is not allowed."""
    call = find_call(output)
    if isinstance(call, str):
        return call
    name, arguments = call
    if name not in allowed:
        return f"error: unknown tool {name} (tools: {', '.join(allowed)})"
    return TOOLS.get(name)(arguments)
