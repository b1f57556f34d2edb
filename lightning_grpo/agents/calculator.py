"""A calculator tool environment for math word problems (the GSM8K tools recipe).

The opening is the record's question as a user message (with an optional system prompt); the model
may call ``calculate(expression)`` any number of times; its last turn without a call is the
answer, scored by the recipe's reward functions (e.g. ``math_accuracy`` against ``answer``).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from .environment import ENVIRONMENTS, Messages
from .tools import ToolEnvironment

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 12"
    """
    value = _eval(ast.parse(expression, mode="eval"))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


@ENVIRONMENTS.register("calculator")
class CalculatorEnv(ToolEnvironment):
    """Math word problems with a calculator tool.

    Args:
        prompt_key: the record column holding the question.
        system_prompt: system message before the question (None: none).
        timeout_s: seconds a calculation may take.
    """

    tools = [calculate]

    def __init__(
        self, prompt_key: str = "question", system_prompt: str | None = None, timeout_s: float | None = 5.0
    ) -> None:
        super().__init__(timeout_s=timeout_s)
        self.prompt_key, self.system_prompt = prompt_key, system_prompt

    def reset(self, record: dict[str, Any], seed: int) -> Messages:
        if self.prompt_key not in record:
            raise KeyError(
                f"CalculatorEnv: record has no column {self.prompt_key!r} (environment_args.prompt_key); columns: {sorted(record)}"
            )
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": str(record[self.prompt_key])}]
