"""A small evaluator of the DynamoDB expressions the pure rules build, so the unit
tests can run a condition against an item and apply an update to it, with no server.

It covers the grammar the rules use: conditions with ``=``, ``<>``, ``<``, ``<=``,
``>``, ``>=``, ``attribute_exists``, ``attribute_not_exists``, ``AND``, ``OR``, ``NOT``
and parentheses; updates with ``SET`` (a value, ``if_not_exists(path, value)``, or
``a + b``), ``REMOVE``, ``ADD`` (numbers and sets) and ``DELETE`` (sets). Items are
typed attribute maps (``{"S": ...}``, ``{"N": ...}``, ``{"SS": [...]}``, ``{"B": ...}``).

It refuses what DynamoDB refuses and the rules could get wrong: a placeholder that is
used but not defined, one that is defined but not used, a clause keyword given twice,
two actions on the same attribute, an update of a key attribute, and a set value
with duplicates. A comparison
with a missing attribute, or across types, is false, except ``<>``, which is true
(as DynamoDB Local answers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from wsfleet import schema
from wsfleet.lease_rules import ConditionalUpdate

Item = dict[str, Any]

KEY_ATTRIBUTES = frozenset({schema.PARTITION_KEY, schema.SORT_KEY})
_TOKEN = re.compile(r"\s*(<>|<=|>=|[=<>(),+-]|[#:][A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_]*)")
_CLAUSES = ("SET", "REMOVE", "ADD", "DELETE")
_COMPARATORS = ("=", "<>", "<", "<=", ">", ">=")


class ExpressionError(ValueError):
    """DynamoDB would refuse the request (a ValidationException)."""


def tokenize(expression: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    rest = expression.rstrip()
    while position < len(rest):
        match = _TOKEN.match(rest, position)
        if match is None:
            raise ExpressionError(f"cannot read {rest[position:]!r} in {expression!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, expression: str, names: Mapping[str, str], values: Mapping[str, Any]):
        self.expression = expression
        self.tokens = tokenize(expression)
        self.position = 0
        self.names = names
        self.values = values
        self.used_names: set[str] = set()
        self.used_values: set[str] = set()

    # --- tokens ----------------------------------------------------------------------

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError(f"unexpected end of {self.expression!r}")
        if expected is not None and token.upper() != expected:
            raise ExpressionError(f"expected {expected}, got {token!r} in {self.expression!r}")
        self.position += 1
        return token

    def at_keyword(self, *keywords: str) -> bool:
        token = self.peek()
        return token is not None and token.upper() in keywords

    def done(self) -> bool:
        return self.position == len(self.tokens)

    # --- operands --------------------------------------------------------------------

    def path(self) -> str:
        token = self.take()
        if not token.startswith("#"):
            raise ExpressionError(f"expected an attribute name placeholder, got {token!r}")
        if token not in self.names:
            raise ExpressionError(f"undefined attribute name placeholder {token}")
        self.used_names.add(token)
        return self.names[token]

    def value(self) -> Any:
        token = self.take()
        if not token.startswith(":"):
            raise ExpressionError(f"expected a value placeholder, got {token!r}")
        if token not in self.values:
            raise ExpressionError(f"undefined value placeholder {token}")
        self.used_values.add(token)
        value = self.values[token]
        for kind in ("SS", "NS", "BS"):
            members = value.get(kind) if isinstance(value, Mapping) else None
            if members is not None and len(set(members)) != len(members):
                raise ExpressionError(f"{token}: the {kind} set contains duplicates")
        return value

    def operand(self, item: Item) -> Any:
        token = self.peek()
        if token is not None and token.startswith("#"):
            return item.get(self.path())
        return self.value()

    # --- conditions ------------------------------------------------------------------

    def condition(self, item: Item) -> bool:
        result = self.conjunction(item)
        while self.at_keyword("OR"):
            self.take()
            right = self.conjunction(item)
            result = result or right
        return result

    def conjunction(self, item: Item) -> bool:
        result = self.negation(item)
        while self.at_keyword("AND"):
            self.take()
            right = self.negation(item)
            result = result and right
        return result

    def negation(self, item: Item) -> bool:
        if self.at_keyword("NOT"):
            self.take()
            return not self.negation(item)
        return self.primary(item)

    def primary(self, item: Item) -> bool:
        if self.peek() == "(":
            self.take("(")
            result = self.condition(item)
            self.take(")")
            return result
        if self.at_keyword("ATTRIBUTE_EXISTS", "ATTRIBUTE_NOT_EXISTS"):
            function = self.take().upper()
            self.take("(")
            present = self.path() in item
            self.take(")")
            return present if function == "ATTRIBUTE_EXISTS" else not present
        left = self.operand(item)
        comparator = self.take()
        if comparator not in _COMPARATORS:
            raise ExpressionError(f"expected a comparator, got {comparator!r}")
        right = self.operand(item)
        return compare(comparator, left, right)

    # --- updates ---------------------------------------------------------------------

    def update(self, item: Item) -> Item:
        """The item after the update; every right-hand side reads the item before it."""
        seen_clauses: set[str] = set()
        touched: set[str] = set()
        new = dict(item)
        while not self.done():
            clause = self.take().upper()
            if clause not in _CLAUSES:
                raise ExpressionError(f"expected SET, REMOVE, ADD or DELETE, got {clause!r}")
            if clause in seen_clauses:
                raise ExpressionError(f"{clause} given twice in {self.expression!r}")
            seen_clauses.add(clause)
            while True:
                name = self.path()
                if name in touched:
                    raise ExpressionError(f"two actions on {name} in {self.expression!r}")
                if name in KEY_ATTRIBUTES:
                    raise ExpressionError(f"cannot update the key attribute {name}")
                touched.add(name)
                self.action(clause, name, item, new)
                if self.peek() != ",":
                    break
                self.take(",")
        if not seen_clauses:
            raise ExpressionError("empty update expression")
        return new

    def action(self, clause: str, name: str, old: Item, new: Item) -> None:
        if clause == "SET":
            self.take("=")
            result = self.set_value(old)
            if self.peek() in ("+", "-"):
                sign = self.take()
                right = self.set_value(old)
                result = arithmetic(sign, result, right)
            new[name] = result
        elif clause == "REMOVE":
            new.pop(name, None)
        elif clause == "ADD":
            added = self.value()
            new[name] = add(old.get(name), added)
        else:
            deleted = self.value()
            remaining = delete(old.get(name), deleted)
            if remaining is None:
                new.pop(name, None)
            else:
                new[name] = remaining

    def set_value(self, old: Item) -> Any:
        if self.at_keyword("IF_NOT_EXISTS"):
            self.take()
            self.take("(")
            name = self.path()
            self.take(",")
            default = self.operand(old)
            self.take(")")
            return old.get(name, default)
        found = self.operand(old)
        if found is None:
            raise ExpressionError(f"SET reads a missing attribute in {self.expression!r}")
        return found


# --- values ------------------------------------------------------------------------------


def _type_of(attribute: Any) -> str:
    (kind,) = attribute.keys()
    return str(kind)


def _plain(attribute: Any) -> Any:
    kind = _type_of(attribute)
    if kind == "N":
        return Decimal(attribute["N"])
    return attribute[kind]


def compare(comparator: str, left: Any, right: Any) -> bool:
    if left is None or right is None or _type_of(left) != _type_of(right):
        return comparator == "<>"
    a, b = _plain(left), _plain(right)
    if isinstance(a, list):  # sets compare as sets, and only for (in)equality
        if comparator not in ("=", "<>"):
            raise ExpressionError("sets compare only with = and <>")
        a, b = set(a), set(b)
    if comparator == "=":
        return bool(a == b)
    if comparator == "<>":
        return bool(a != b)
    if comparator == "<":
        return bool(a < b)
    if comparator == "<=":
        return bool(a <= b)
    if comparator == ">":
        return bool(a > b)
    return bool(a >= b)


def _number(value: Decimal) -> dict[str, str]:
    return {"N": str(value.normalize()) if value != value.to_integral() else str(int(value))}


def arithmetic(sign: str, left: Any, right: Any) -> Any:
    if _type_of(left) != "N" or _type_of(right) != "N":
        raise ExpressionError("+ and - take numbers")
    a, b = _plain(left), _plain(right)
    return _number(a + b if sign == "+" else a - b)


def add(current: Any, added: Any) -> Any:
    kind = _type_of(added)
    if kind == "N":
        base = Decimal(0) if current is None else _plain(current)
        if current is not None and _type_of(current) != "N":
            raise ExpressionError("ADD of a number to a non-number")
        return _number(base + _plain(added))
    if kind in ("SS", "NS", "BS"):
        if current is not None and _type_of(current) != kind:
            raise ExpressionError("ADD of a set to another type")
        members = [] if current is None else list(current[kind])
        for member in added[kind]:
            if member not in members:
                members.append(member)
        return {kind: members}
    raise ExpressionError(f"ADD takes a number or a set, not {kind}")


def delete(current: Any, deleted: Any) -> Any:
    kind = _type_of(deleted)
    if kind not in ("SS", "NS", "BS"):
        raise ExpressionError(f"DELETE takes a set, not {kind}")
    if current is None:
        return None
    if _type_of(current) != kind:
        raise ExpressionError("DELETE from another type")
    members = [m for m in current[kind] if m not in deleted[kind]]
    return {kind: members} if members else None  # an empty set is no attribute


# --- whole requests ----------------------------------------------------------------------


def _check_all_used(
    parsers: list[_Parser], names: Mapping[str, str], values: Mapping[str, Any]
) -> None:
    used_names = set().union(*(p.used_names for p in parsers))
    used_values = set().union(*(p.used_values for p in parsers))
    if unused := sorted(set(names) - used_names):
        raise ExpressionError(f"unused attribute name placeholders: {unused}")
    if unused := sorted(set(values) - used_values):
        raise ExpressionError(f"unused value placeholders: {unused}")


def holds(
    condition: str,
    item: Item | None,
    names: Mapping[str, str],
    values: Mapping[str, Any],
    *,
    all_used: bool = True,
) -> bool:
    """Whether ``condition`` holds for ``item`` (None: there is no item)."""
    parser = _Parser(condition, names, values)
    result = parser.condition({} if item is None else item)
    if not parser.done():
        raise ExpressionError(f"trailing {parser.tokens[parser.position :]} in {condition!r}")
    if all_used:
        _check_all_used([parser], names, values)
    return result


def apply(
    update_expression: str,
    condition_expression: str,
    names: Mapping[str, str],
    values: Mapping[str, Any],
    item: Item | None,
) -> Item | None:
    """One conditional ``UpdateItem``: the item after it, or None when the condition
    fails (the item is then unchanged). Both expressions are read in full either way,
    so a malformed or unused placeholder fails whatever the item."""
    old = {} if item is None else item
    check = _Parser(condition_expression, names, values)
    passed = check.condition(old)
    if not check.done():
        raise ExpressionError(f"trailing tokens in {condition_expression!r}")
    change = _Parser(update_expression, names, values)
    new = change.update(old)
    _check_all_used([check, change], names, values)
    return new if passed else None


def attempt(update: ConditionalUpdate, item: Item | None) -> Item | None:
    """:func:`apply` for a rule's :class:`ConditionalUpdate`."""
    return apply(
        update.update_expression, update.condition_expression, update.names, update.values, item
    )


def attempt_kwargs(kwargs: Mapping[str, Any], item: Item | None) -> Item | None:
    """:func:`apply` for the keyword arguments of an ``update_item`` call."""
    return apply(
        kwargs["UpdateExpression"],
        kwargs["ConditionExpression"],
        kwargs["ExpressionAttributeNames"],
        kwargs["ExpressionAttributeValues"],
        item,
    )
