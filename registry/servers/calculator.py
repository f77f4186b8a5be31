"""Calculator MCP server: arithmetic on numbers and a safe expression evaluator (no names, no calls)."""

from __future__ import annotations

import ast
import math
import operator

from registry.decorator import tool
from registry.servers.runtime import ToolInputError, handlers_from_functions, serve

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000


@tool
def add(a: float, b: float) -> dict:
    """Add two numbers."""
    return {"result": a + b}


@tool
def multiply(a: float, b: float) -> dict:
    """Multiply two numbers."""
    return {"result": a * b}


@tool
def divide(numerator: float, denominator: float) -> dict:
    """Divide one number by another."""
    if denominator == 0:
        raise ToolInputError("denominator is 0; division by zero is undefined")
    return {"result": numerator / denominator}


@tool
def evaluate(expression: str) -> dict:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: e.g. "(2 + 3) * 4 ** 2"
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise ToolInputError(f"cannot parse {expression!r}: {e.msg}") from None
    return {"result": _eval(tree.body)}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolInputError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolInputError("division by zero") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolInputError("result is not a finite number")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ToolInputError(f"unsupported element {ast.dump(node)[:60]}; only numbers and + - * / // % ** ( )")


FUNCTIONS = [add, multiply, divide, evaluate]

if __name__ == "__main__":
    serve("calculator", handlers_from_functions(FUNCTIONS))
