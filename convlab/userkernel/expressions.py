"""Arithmetic over a layer's sizes, for kernel-file headers: `ceil(B*M*Ho*Wo / 256)`.

A header is text a user wrote, so it is never handed to Python's eval: the expression is parsed
with `ast` and only these forms are evaluated: integer and decimal literals, names from the
given environment, + - * / // % ** and unary minus, comparisons, and/or/not, and the functions
ceil, floor, min, max, abs. `/` is exact (a Fraction), so `ceil(Ho / TILE)` is right for any size,
and a value meant as an integer (a grid dimension) must come out whole.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Mapping

Number = int | Fraction

FUNCTIONS = {
    "ceil": lambda v: math.ceil(v),
    "floor": lambda v: math.floor(v),
    "min": min,
    "max": max,
    "abs": abs,
}
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_COMPARE = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
MAX_POWER = 64  # 2**64 already exceeds every size a launch can take


class ExpressionError(ValueError):
    """An expression that does not parse, names something unknown, or cannot be evaluated."""


def parse(text: str) -> ast.Expression:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"'{text.strip()}' is not an expression ({exc.msg})") from None
    for node in ast.walk(tree):
        _check_node(node, text)
    return tree


def _check_node(node: ast.AST, text: str) -> None:
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call,
               ast.Name, ast.Constant, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
    if not isinstance(node, allowed):
        raise ExpressionError(f"'{text.strip()}': {type(node).__name__} is not allowed here "
                              "(use numbers, names, + - * / // % **, comparisons, and/or/not, "
                              f"{', '.join(FUNCTIONS)})")
    if isinstance(node, ast.Constant) and (isinstance(node.value, bool)
                                           or not isinstance(node.value, (int, float))):
        raise ExpressionError(f"'{text.strip()}': only numbers may appear as literals")
    if isinstance(node, ast.BinOp) and not isinstance(node.op, (*_BINARY, ast.Div, ast.Pow)):
        raise ExpressionError(f"'{text.strip()}': operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        raise ExpressionError(f"'{text.strip()}': operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            raise ExpressionError(f"'{text.strip()}': the only functions are "
                                  f"{', '.join(FUNCTIONS)}")


def names(tree: ast.Expression) -> set[str]:
    """The variable names an expression reads (function names excluded)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def evaluate(tree: ast.Expression | str, env: Mapping[str, Number]) -> Number:
    if isinstance(tree, str):
        tree = parse(tree)
    try:
        return _eval(tree.body, env)
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except OverflowError:
        raise ExpressionError("a value is too large") from None


def evaluate_int(tree: ast.Expression | str, env: Mapping[str, Number], what: str) -> int:
    """Evaluate and insist on a whole number (a size, a grid dimension, a define)."""
    value = evaluate(tree, env)
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise ExpressionError(f"{what} is {float(value):g}, not a whole number "
                                  "(round it with ceil(...) or floor(...))")
        value = int(value)
    return int(value)


def _number(value) -> Number:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return Fraction(value)
    return value


def _eval(node: ast.AST, env: Mapping[str, Number]) -> Number:
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            known = ", ".join(sorted(env))
            raise ExpressionError(f"unknown name '{node.id}' (known here: {known})")
        return _number(env[node.id])
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return int(not value)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ExpressionError("division by zero")
        if isinstance(node.op, ast.Div):
            return Fraction(left) / Fraction(right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_POWER:
                raise ExpressionError(f"exponent {right} is too large")
            if isinstance(right, int):
                return _number(Fraction(left) ** right)
            return Fraction(float(left) ** float(right))
        return _number(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env) for v in node.values]
        return int(all(values) if isinstance(node.op, ast.And) else any(values))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return 0
            left = right
        return 1
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        try:
            return _number(FUNCTIONS[node.func.id](*args))
        except TypeError:
            raise ExpressionError(f"{node.func.id}() takes other arguments than "
                                  f"{len(args)}") from None
    raise ExpressionError(f"cannot evaluate {type(node).__name__}")


def as_plain(value: Number) -> int | float:
    """An evaluated value as an int when whole, else a float (for -D defines and display)."""
    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else float(value)
    return value
