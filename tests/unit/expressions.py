"""The expression evaluator moved to :mod:`sim.expressions` (the simulated DynamoDB
runs on it); the rule tests import it from here as before."""

from sim.expressions import (
    KEY_ATTRIBUTES,
    ExpressionError,
    Item,
    apply,
    attempt,
    attempt_kwargs,
    holds,
    tokenize,
)

__all__ = [
    "KEY_ATTRIBUTES",
    "ExpressionError",
    "Item",
    "apply",
    "attempt",
    "attempt_kwargs",
    "holds",
    "tokenize",
]
