"""DynamoDB's condition, update, projection and key condition expressions, parsed once
and evaluated against items, with no server: the simulated DynamoDB
(:mod:`sim.dynamodb`) runs every request through it, and the unit tests of the pure
rules run a rule's condition against an item and apply its update to it.

The grammar is the one the code uses, and a little more. Conditions (and filters):
``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``, ``IN``, ``attribute_exists``,
``attribute_not_exists``, ``attribute_type``, ``begins_with``, ``contains``, ``size``,
``AND``, ``OR``, ``NOT`` and parentheses, keywords in any case. Updates: ``SET`` (a
value, ``if_not_exists(path, value)``, ``list_append(a, b)``, ``a + b``, ``a - b``),
``REMOVE``, ``ADD`` (numbers and sets) and ``DELETE`` (sets). Projections: a list of
attributes. Key conditions: ``key = value``, and on the sort key ``=``, ``<``,
``<=``, ``>``, ``>=``, ``BETWEEN`` or ``begins_with``. Attributes are named through
``#placeholders`` only, at the top level of the item: a bare attribute name (DynamoDB
would check it against its reserved words) and a nested path (``a.b``, ``a[0]``)
raise :class:`UnsupportedExpressionError`, so a simulation never silently accepts
what DynamoDB could refuse.

It refuses what DynamoDB refuses, with DynamoDB's messages (as DynamoDB Local gives
them, checked by ``tests/sim/test_dynamodb_conformance.py``): syntax errors, a
placeholder used but not defined or defined but not used, a clause keyword given
twice, two actions on one attribute, an update of a key attribute, a value that is
no valid attribute value (duplicates in a set, an empty set, a malformed number), an
operand of the wrong type, a ``SET`` that reads a missing attribute. A comparison with
a missing attribute, or across types, is false, except ``<>``, which is true.

Each request goes through three steps: the expressions are parsed (cached: the same
strings recur thousands of times), bound to the request's names and values (every
check that does not depend on the item), then evaluated against the item.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final

from sim.attributes import (
    LONG_NAMES,
    NUMBERS,
    ORDERED_TYPES,
    SET_TYPES,
    TYPES,
    Attr,
    InvalidValueError,
    Item,
    canonical_item,
    canonical_value,
    describe,
    number_attr,
    ordered,
    type_of,
)
from wsfleet import schema
from wsfleet.lease_rules import ConditionalUpdate

__all__ = [
    "KEY_ATTRIBUTES",
    "Condition",
    "ExpressionError",
    "Item",
    "KeyCondition",
    "KeyTerm",
    "Projection",
    "UnsupportedExpressionError",
    "Update",
    "apply",
    "attempt",
    "attempt_kwargs",
    "check_all_used",
    "holds",
    "parse_condition",
    "parse_key_condition",
    "parse_projection",
    "parse_update",
    "tokenize",
    "validate_names",
    "validate_values",
]

Names = Mapping[str, str]
Values = Mapping[str, Attr]

KEY_ATTRIBUTES: Final = frozenset({schema.PARTITION_KEY, schema.SORT_KEY})
"""The connection table's key: what :func:`apply` refuses to update by default."""

_TOKEN: Final = re.compile(
    r"\s*(?:(<>|<=|>=|[=<>(),+\-.\[\]])|([#:][A-Za-z0-9_]+)|([A-Za-z_][A-Za-z0-9_]*)|(\S))"
)
_COMPARATORS: Final = ("=", "<>", "<", "<=", ">", ">=")
_CLAUSES: Final = ("SET", "REMOVE", "ADD", "DELETE")
_CACHE: Final = 4096


class ExpressionError(ValueError):
    """DynamoDB would refuse the request: a ValidationException with this message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedExpressionError(NotImplementedError):
    """An expression DynamoDB may accept that the simulator does not evaluate (a bare
    attribute name, a nested path, a function it does not know)."""


# --- tokens ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    start: int
    end: int


def _tokens(source: str) -> list[_Token]:
    found: list[_Token] = []
    position = 0
    end = len(source.rstrip())
    while position < end:
        match = _TOKEN.match(source, position)
        if match is None:  # pragma: no cover - the last alternative matches any character
            break
        index = match.lastindex or 1
        found.append(_Token(match.group(index), match.start(index), match.end(index)))
        position = match.end()
    return found


def tokenize(expression: str) -> list[str]:
    """The tokens of an expression, as text."""
    return [token.text for token in _tokens(expression)]


# --- values and names ----------------------------------------------------------------------


def validate_values(values: Mapping[str, Any] | None) -> dict[str, Attr]:
    """Checked, canonical copies of ``ExpressionAttributeValues``."""
    if values is None:
        return {}
    checked: dict[str, Attr] = {}
    for key, value in values.items():
        if not key.startswith(":") or len(key) < 2:
            raise ExpressionError(
                f'ExpressionAttributeValues contains invalid key: Syntax error; key: "{key}"'
            )
        try:
            checked[key] = canonical_value(value)
        except InvalidValueError as error:
            raise ExpressionError(
                f"ExpressionAttributeValues contains invalid value: {error.detail} for key {key}"
            ) from None
    return checked


def validate_names(names: Mapping[str, str] | None) -> dict[str, str]:
    if names is None:
        return {}
    for key in names:
        if not key.startswith("#") or len(key) < 2:
            raise ExpressionError(
                f'ExpressionAttributeNames contains invalid key: Syntax error; key: "{key}"'
            )
    return dict(names)


def check_all_used(parsed: Iterable[_Parsed], names: Names, values: Values) -> None:
    """DynamoDB refuses a name or value placeholder no expression of the request uses."""
    used: set[str] = set()
    for expression in parsed:
        used.update(expression.placeholders)
    if unused := sorted(set(names) - used):
        raise ExpressionError(
            "Value provided in ExpressionAttributeNames unused in expressions: "
            f"keys: {{{', '.join(unused)}}}"
        )
    if unused := sorted(set(values) - used):
        raise ExpressionError(
            "Value provided in ExpressionAttributeValues unused in expressions: "
            f"keys: {{{', '.join(unused)}}}"
        )


# --- what parsing yields -----------------------------------------------------------------

Operand = Callable[[Item, Names, Values], Attr | None]
Predicate = Callable[[Item, Names, Values], bool]
StaticCheck = Callable[[Names, Values], None]


@dataclass(frozen=True, slots=True)
class _Parsed:
    kind: str
    """How DynamoDB's messages name the expression (``ConditionExpression``...)."""
    source: str
    placeholders: tuple[str, ...]
    """Every ``#name`` and ``:value`` in the order they appear, once each."""
    checks: tuple[StaticCheck, ...]

    def bind(self, names: Names, values: Values) -> None:
        """Every check that does not depend on the item: placeholders defined,
        operands of the types their operators take."""
        for placeholder in self.placeholders:
            if placeholder.startswith("#"):
                if placeholder not in names:
                    raise self.error(
                        "An expression attribute name used in the document path is not "
                        f"defined; attribute name: {placeholder}"
                    )
            elif placeholder not in values:
                raise self.error(
                    "An expression attribute value used in expression is not defined; "
                    f"attribute value: {placeholder}"
                )
        for check in self.checks:
            check(names, values)

    def error(self, detail: str) -> ExpressionError:
        return ExpressionError(f"Invalid {self.kind}: {detail}")


@dataclass(frozen=True, slots=True)
class Condition(_Parsed):
    test: Predicate
    """Whether the condition holds for the item (``{}``: there is none)."""


@dataclass(frozen=True, slots=True)
class UpdateAction:
    clause: str
    placeholder: str
    """The ``#name`` of the attribute it changes."""
    value: Operand | None
    """``SET``: the new value; ``ADD``/``DELETE``: the operand; ``REMOVE``: None."""


@dataclass(frozen=True, slots=True)
class Update(_Parsed):
    actions: tuple[UpdateAction, ...]

    def touched(self, names: Names) -> list[str]:
        """The attributes the update changes, in order; refuses two actions on one."""
        seen: list[str] = []
        for action in self.actions:
            name = names[action.placeholder]
            if name in seen:
                raise self.error(
                    "Two document paths overlap with each other; must remove or rewrite one "
                    f"of these paths; path one: [{name}], path two: [{name}]"
                )
            seen.append(name)
        return seen

    def apply(self, item: Item, names: Names, values: Values) -> Item:
        """The item after the update; every right-hand side reads the item before it."""
        new = dict(item)
        for action in self.actions:
            name = names[action.placeholder]
            if action.clause == "SET":
                assert action.value is not None
                result = action.value(item, names, values)
                assert result is not None
                new[name] = result
            elif action.clause == "REMOVE":
                new.pop(name, None)
            elif action.clause == "ADD":
                assert action.value is not None
                added = action.value(item, names, values)
                assert added is not None
                new[name] = _add(item.get(name), added)
            else:
                assert action.value is not None
                deleted = action.value(item, names, values)
                assert deleted is not None
                remaining = _delete(item.get(name), deleted)
                if remaining is None:
                    new.pop(name, None)
                else:
                    new[name] = remaining
        return new


@dataclass(frozen=True, slots=True)
class Projection(_Parsed):
    paths: tuple[str, ...]
    """The ``#name`` placeholders, in order."""

    def attributes(self, names: Names) -> list[str]:
        seen: list[str] = []
        for placeholder in self.paths:
            name = names[placeholder]
            if name in seen:
                raise self.error(
                    "Two document paths overlap with each other; must remove or rewrite one "
                    f"of these paths; path one: [{name}], path two: [{name}]"
                )
            seen.append(name)
        return seen


@dataclass(frozen=True, slots=True)
class KeyTerm:
    """One condition of a key condition: ``placeholder operator values``; operator
    one of ``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``, ``BEGINS_WITH``."""

    placeholder: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KeyCondition(_Parsed):
    terms: tuple[KeyTerm, ...]


# --- the parser --------------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str, kind: str) -> None:
        self.source = source
        self.kind = kind
        self.tokens = _tokens(source)
        self.position = 0
        self.placeholders: dict[str, None] = {}
        self.checks: list[StaticCheck] = []
        if not self.tokens:
            raise self.error("The expression can not be empty;")

    def error(self, detail: str) -> ExpressionError:
        return ExpressionError(f"Invalid {self.kind}: {detail}")

    # --- tokens ----------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> str | None:
        index = self.position + ahead
        return self.tokens[index].text if index < len(self.tokens) else None

    def at(self, *keywords: str) -> bool:
        token = self.peek()
        return token is not None and token.upper() in keywords

    def syntax_error(self) -> ExpressionError:
        """DynamoDB's syntax error at the current token: the token and the text from
        the token before it to the token after it."""
        tokens, index = self.tokens, self.position
        current = tokens[index] if index < len(tokens) else None
        start = tokens[index - 1].start if index > 0 else (current.start if current else 0)
        if index + 1 < len(tokens):
            end = tokens[index + 1].end
        elif current is not None:
            end = current.end
        else:
            end = len(self.source)
        text = current.text if current is not None else "<EOF>"
        return self.error(f'Syntax error; token: "{text}", near: "{self.source[start:end]}"')

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.upper() != expected):
            raise self.syntax_error()
        self.position += 1
        return token

    def done(self) -> bool:
        return self.position == len(self.tokens)

    def finish(self) -> None:
        if not self.done():
            raise self.syntax_error()

    def note(self, placeholder: str) -> str:
        self.placeholders.setdefault(placeholder, None)
        return placeholder

    # --- operands --------------------------------------------------------------------

    def path(self) -> str:
        """A ``#name`` placeholder naming a top-level attribute."""
        token = self.peek()
        if token is None:
            raise self.syntax_error()
        if token.startswith("#"):
            self.position += 1
            if self.peek() in (".", "["):
                raise UnsupportedExpressionError(
                    f"nested attribute paths are not simulated: {self.source!r}"
                )
            return self.note(token)
        if token.startswith(":") and len(token) > 1:
            raise _requires_path(self)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise UnsupportedExpressionError(
                f"attribute names are simulated only as #placeholders: {token!r} in {self.source!r}"
            )
        raise self.syntax_error()

    def value_placeholder(self) -> str:
        token = self.peek()
        if token is None or not token.startswith(":") or len(token) < 2:
            raise self.syntax_error()
        self.position += 1
        return self.note(token)

    # --- conditions ------------------------------------------------------------------

    def condition(self) -> Predicate:
        left = self.conjunction()
        while self.at("OR"):
            self.take()
            right = self.conjunction()
            left = _either(left, right)
        return left

    def conjunction(self) -> Predicate:
        left = self.negation()
        while self.at("AND"):
            self.take()
            right = self.negation()
            left = _both(left, right)
        return left

    def negation(self) -> Predicate:
        if self.at("NOT"):
            self.take()
            inner = self.negation()
            return lambda item, names, values: not inner(item, names, values)
        return self.primary()

    def primary(self) -> Predicate:
        if self.peek() == "(":
            self.take("(")
            inner = self.condition()
            self.take(")")
            return inner
        if self.peek(1) == "(" and self.at(
            "ATTRIBUTE_EXISTS", "ATTRIBUTE_NOT_EXISTS", "ATTRIBUTE_TYPE", "BEGINS_WITH", "CONTAINS"
        ):
            return self.function()
        left = self.operand()
        if self.at("BETWEEN"):
            self.take()
            low = self.operand()
            self.take("AND")
            high = self.operand()
            self.checks.append(_between_check(self, left, low, high))
            return _between(left.get, low.get, high.get)
        if self.at("IN"):
            self.take()
            self.take("(")
            options = [self.operand()]
            while self.peek() == ",":
                self.take(",")
                options.append(self.operand())
            self.take(")")
            return _among(left.get, tuple(o.get for o in options))
        comparator = self.peek()
        if comparator not in _COMPARATORS:
            raise self.syntax_error()
        self.take()
        right = self.operand()
        if comparator not in ("=", "<>"):
            for side in (left, right):
                self.checks.append(_ordered_check(self, side, comparator))
        return _comparison(comparator, left.get, right.get)

    def function(self) -> Predicate:
        name = self.take().lower()
        self.take("(")
        if name in ("attribute_exists", "attribute_not_exists"):
            if self.peek() is not None and str(self.peek()).startswith(":"):
                raise self.error(
                    f"Operator or function requires a document path; operator or function: {name}"
                )
            placeholder = self.path()
            self.take(")")
            exists = name == "attribute_exists"
            return lambda item, names, values: (names[placeholder] in item) is exists
        if name == "attribute_type":
            placeholder = self.path()
            self.take(",")
            wanted = self.value_placeholder()
            self.take(")")
            self.checks.append(_type_name_check(self, wanted))
            return _has_type(placeholder, wanted)
        subject = self.operand()
        self.take(",")
        argument = self.operand()
        self.take(")")
        if name == "begins_with":
            for side in (subject, argument):
                self.checks.append(_begins_with_check(self, side))
            return _begins_with(subject.get, argument.get)
        return _contains(subject.get, argument.get)

    def operand(self) -> _Operand:
        token = self.peek()
        if token is not None and token.lower() == "size" and self.peek(1) == "(":
            self.take()
            self.take("(")
            placeholder = self.path()
            self.take(")")
            return _Operand(_size_of(placeholder), None)
        if token is not None and token.startswith(":") and len(token) > 1:
            placeholder = self.value_placeholder()
            return _Operand(_value_of(placeholder), placeholder)
        placeholder = self.path()
        return _Operand(_path_of(placeholder), None)

    # --- updates ---------------------------------------------------------------------

    def update(self) -> tuple[UpdateAction, ...]:
        seen_clauses: set[str] = set()
        actions: list[UpdateAction] = []
        while not self.done():
            if not self.at(*_CLAUSES):
                raise self.syntax_error()
            clause = self.take().upper()
            if clause in seen_clauses:
                raise self.error(
                    f'The "{clause}" section can only be used once in an update expression;'
                )
            seen_clauses.add(clause)
            while True:
                actions.append(self.action(clause))
                if self.peek() != ",":
                    break
                self.take(",")
        return tuple(actions)

    def action(self, clause: str) -> UpdateAction:
        placeholder = self.path()
        if clause == "SET":
            self.take("=")
            return UpdateAction(clause, placeholder, self.set_value())
        if clause == "REMOVE":
            return UpdateAction(clause, placeholder, None)
        value = self.value_placeholder()
        self.checks.append(_set_operand_check(self, clause, value))
        return UpdateAction(clause, placeholder, _value_of(value))

    def set_value(self) -> Operand:
        left = self.set_operand()
        if self.peek() in ("+", "-"):
            sign = str(self.take())
            right = self.set_operand()
            for side in (left, right):
                self.checks.append(_number_operand_check(self, side, sign))
            return _arithmetic(sign, left.get, right.get)
        return left.get

    def set_operand(self) -> _Operand:
        token = self.peek()
        if token is not None and self.peek(1) == "(" and re.fullmatch(r"[A-Za-z_]\w*", token):
            function = self.take().lower()
            if function not in ("if_not_exists", "list_append"):
                raise self.error(
                    f"The function is not allowed in an update expression; function: {function}"
                )
            self.take("(")
            if function == "if_not_exists":
                placeholder = self.path()
                self.take(",")
                default = self.set_operand()
                self.take(")")
                return _Operand(_if_not_exists(placeholder, default.get), None)
            first = self.set_operand()
            self.take(",")
            second = self.set_operand()
            self.take(")")
            for side in (first, second):
                self.checks.append(_list_operand_check(self, side))
            return _Operand(_list_append(first.get, second.get), None)
        if token is not None and token.startswith(":") and len(token) > 1:
            placeholder = self.value_placeholder()
            return _Operand(_value_of(placeholder), placeholder)
        placeholder = self.path()
        return _Operand(_required_path(placeholder), None)

    # --- projections -----------------------------------------------------------------

    def projection(self) -> tuple[str, ...]:
        paths = [self.path()]
        while self.peek() == ",":
            self.take(",")
            paths.append(self.path())
        return tuple(paths)

    # --- key conditions --------------------------------------------------------------

    def key_terms(self) -> list[KeyTerm]:
        terms = self.key_term()
        while self.at("AND"):
            self.take()
            terms += self.key_term()
        if self.at("OR", "NOT"):
            raise ExpressionError(
                f"Invalid operator used in KeyConditionExpression: {str(self.peek()).upper()}"
            )
        return terms

    def key_term(self) -> list[KeyTerm]:
        if self.at("OR", "NOT"):
            raise ExpressionError(
                f"Invalid operator used in KeyConditionExpression: {str(self.peek()).upper()}"
            )
        if self.peek() == "(":
            self.take("(")
            terms = self.key_terms()
            self.take(")")
            return terms
        if self.at("BEGINS_WITH") and self.peek(1) == "(":
            self.take()
            self.take("(")
            placeholder = self.path()
            self.take(",")
            prefix = self.value_placeholder()
            self.take(")")
            return [KeyTerm(placeholder, "BEGINS_WITH", (prefix,))]
        if self.peek(1) == "(" and re.fullmatch(r"[A-Za-z_]\w*", str(self.peek())):
            raise ExpressionError(
                f"Invalid operator used in KeyConditionExpression: {str(self.peek()).lower()}"
            )
        flipped = str(self.peek()).startswith(":")
        first = self.value_placeholder() if flipped else self.path()
        if self.at("BETWEEN") and not flipped:
            self.take()
            low = self.value_placeholder()
            self.take("AND")
            high = self.value_placeholder()
            return [KeyTerm(first, "BETWEEN", (low, high))]
        operator = self.peek()
        if operator is not None and operator.upper() in ("<>", "IN", "BETWEEN"):
            raise ExpressionError(
                f"Invalid operator used in KeyConditionExpression: {operator.upper()}"
            )
        if operator not in _COMPARATORS:
            raise self.syntax_error()
        self.take()
        second = self.path() if flipped else self.value_placeholder()
        if flipped:
            operator = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(operator, operator)
            return [KeyTerm(second, operator, (first,))]
        return [KeyTerm(first, operator, (second,))]


# --- parsing, cached -----------------------------------------------------------------------


@lru_cache(maxsize=_CACHE)
def parse_condition(source: str, kind: str = "ConditionExpression") -> Condition:
    """A condition or filter expression (``kind``: ``ConditionExpression`` or
    ``FilterExpression``, as DynamoDB's messages name it)."""
    parser = _Parser(source, kind)
    test = parser.condition()
    parser.finish()
    return Condition(kind, source, tuple(parser.placeholders), tuple(parser.checks), test)


@lru_cache(maxsize=_CACHE)
def parse_update(source: str) -> Update:
    parser = _Parser(source, "UpdateExpression")
    actions = parser.update()
    return Update(
        "UpdateExpression", source, tuple(parser.placeholders), tuple(parser.checks), actions
    )


@lru_cache(maxsize=_CACHE)
def parse_projection(source: str) -> Projection:
    parser = _Parser(source, "ProjectionExpression")
    paths = parser.projection()
    parser.finish()
    return Projection("ProjectionExpression", source, tuple(parser.placeholders), (), paths)


@lru_cache(maxsize=_CACHE)
def parse_key_condition(source: str) -> KeyCondition:
    parser = _Parser(source, "KeyConditionExpression")
    terms = parser.key_terms()
    parser.finish()
    return KeyCondition(
        "KeyConditionExpression", source, tuple(parser.placeholders), (), tuple(terms)
    )


# --- operands and predicates ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Operand:
    get: Operand
    value: str | None
    """The ``:value`` placeholder when the operand is one (its type is known before
    the item is read)."""


def _path_of(placeholder: str) -> Operand:
    return lambda item, names, values: item.get(names[placeholder])


def _value_of(placeholder: str) -> Operand:
    return lambda item, names, values: values[placeholder]


def _required_path(placeholder: str) -> Operand:
    def read(item: Item, names: Names, values: Values) -> Attr:
        found = item.get(names[placeholder])
        if found is None:
            raise ExpressionError(
                "The provided expression refers to an attribute that does not exist in the item"
            )
        return found  # type: ignore[no-any-return]

    return read


def _size_of(placeholder: str) -> Operand:
    def size(item: Item, names: Names, values: Values) -> Attr | None:
        found = item.get(names[placeholder])
        if found is None:
            return None
        kind = type_of(found)
        if kind in ("N", "BOOL", "NULL"):
            return None
        return {"N": str(len(found[kind]))}

    return size


def _if_not_exists(placeholder: str, default: Operand) -> Operand:
    def read(item: Item, names: Names, values: Values) -> Attr | None:
        found = item.get(names[placeholder])
        return default(item, names, values) if found is None else found

    return read


def _list_append(first: Operand, second: Operand) -> Operand:
    def append(item: Item, names: Names, values: Values) -> Attr:
        a, b = first(item, names, values), second(item, names, values)
        if a is None or b is None or type_of(a) != "L" or type_of(b) != "L":
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        return {"L": [*a["L"], *b["L"]]}

    return append


def _arithmetic(sign: str, left: Operand, right: Operand) -> Operand:
    def compute(item: Item, names: Names, values: Values) -> Attr:
        a, b = left(item, names, values), right(item, names, values)
        if a is None or b is None or "N" not in a or "N" not in b:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        x, y = Decimal(a["N"]), Decimal(b["N"])
        return number_attr(NUMBERS.add(x, y) if sign == "+" else NUMBERS.subtract(x, y))

    return compute


def _either(left: Predicate, right: Predicate) -> Predicate:
    return lambda item, names, values: left(item, names, values) or right(item, names, values)


def _both(left: Predicate, right: Predicate) -> Predicate:
    return lambda item, names, values: left(item, names, values) and right(item, names, values)


def _comparison(comparator: str, left: Operand, right: Operand) -> Predicate:
    if comparator == "=":
        return lambda item, names, values: _equal(
            left(item, names, values), right(item, names, values)
        )
    if comparator == "<>":
        return lambda item, names, values: (
            not _equal(left(item, names, values), right(item, names, values))
        )

    def test(item: Item, names: Names, values: Values) -> bool:
        return compare(comparator, left(item, names, values), right(item, names, values))

    return test


def _between(subject: Operand, low: Operand, high: Operand) -> Predicate:
    def test(item: Item, names: Names, values: Values) -> bool:
        value = subject(item, names, values)
        return compare(">=", value, low(item, names, values)) and compare(
            "<=", value, high(item, names, values)
        )

    return test


def _among(subject: Operand, options: tuple[Operand, ...]) -> Predicate:
    def test(item: Item, names: Names, values: Values) -> bool:
        value = subject(item, names, values)
        return value is not None and any(_equal(value, o(item, names, values)) for o in options)

    return test


def _has_type(placeholder: str, wanted: str) -> Predicate:
    def test(item: Item, names: Names, values: Values) -> bool:
        found = item.get(names[placeholder])
        return found is not None and type_of(found) == values[wanted].get("S")

    return test


def _begins_with(subject: Operand, prefix: Operand) -> Predicate:
    def test(item: Item, names: Names, values: Values) -> bool:
        value, start = subject(item, names, values), prefix(item, names, values)
        if value is None or start is None:
            return False
        kind = type_of(value)
        if kind not in ("S", "B") or type_of(start) != kind:
            return False
        return bool(value[kind].startswith(start[kind]))

    return test


def _contains(subject: Operand, member: Operand) -> Predicate:
    def test(item: Item, names: Names, values: Values) -> bool:
        value, wanted = subject(item, names, values), member(item, names, values)
        if value is None or wanted is None:
            return False
        kind, wanted_kind = type_of(value), type_of(wanted)
        if kind == "S" and wanted_kind == "S":
            return bool(wanted["S"] in value["S"])
        if kind == "B" and wanted_kind == "B":
            return bool(wanted["B"] in value["B"])
        if kind in SET_TYPES and wanted_kind == kind[0]:
            return bool(wanted[wanted_kind] in value[kind])
        if kind == "L":
            return any(_equal(element, wanted) for element in value["L"])
        return False

    return test


def _equal(left: Attr | None, right: Attr | None) -> bool:
    """Typed equality of canonical values (a missing attribute equals nothing)."""
    return left is not None and right is not None and left == right


def compare(comparator: str, left: Attr | None, right: Attr | None) -> bool:
    """``left comparator right`` as DynamoDB answers it: false with a missing
    attribute or across types, except ``<>``, which is then true."""
    if comparator == "=":
        return _equal(left, right)
    if comparator == "<>":
        return not _equal(left, right)
    if left is None or right is None:
        return False
    kind = type_of(left)
    if kind not in ORDERED_TYPES or type_of(right) != kind:
        return False
    a, b = ordered(left), ordered(right)
    if comparator == "<":
        return bool(a < b)  # type: ignore[operator]
    if comparator == "<=":
        return bool(a <= b)  # type: ignore[operator]
    if comparator == ">":
        return bool(a > b)  # type: ignore[operator]
    return bool(a >= b)  # type: ignore[operator]


def _add(current: Attr | None, added: Attr) -> Attr:
    kind = type_of(added)
    if kind == "N":
        if current is None:
            return added
        if "N" not in current:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        return number_attr(NUMBERS.add(Decimal(current["N"]), Decimal(added["N"])))
    if current is None:
        return added
    if type_of(current) != kind:
        raise ExpressionError("An operand in the update expression has an incorrect data type")
    return canonical_value({kind: sorted(set(current[kind]) | set(added[kind]))})


def _delete(current: Attr | None, deleted: Attr) -> Attr | None:
    kind = type_of(deleted)
    if current is None:
        return None
    if type_of(current) != kind:
        raise ExpressionError("An operand in the update expression has an incorrect data type")
    gone = set(deleted[kind])
    members = [m for m in current[kind] if m not in gone]
    return {kind: members} if members else None  # an empty set is no attribute


# --- checks that need the values ----------------------------------------------------------


def _requires_path(parser: _Parser) -> ExpressionError:
    return parser.syntax_error()


def _operand_type(operand: _Operand, values: Values) -> str | None:
    return None if operand.value is None else type_of(values[operand.value])


def _ordered_check(parser: _Parser, operand: _Operand, comparator: str) -> StaticCheck:
    kind = parser.kind

    def check(names: Names, values: Values) -> None:
        found = _operand_type(operand, values)
        if found is not None and found not in ORDERED_TYPES:
            raise ExpressionError(
                f"Invalid {kind}: Incorrect operand type for operator or function; operator "
                f"or function: {comparator}, operand type: {found}"
            )

    return check


def _between_check(
    parser: _Parser, subject: _Operand, low: _Operand, high: _Operand
) -> StaticCheck:
    kind = parser.kind

    def check(names: Names, values: Values) -> None:
        for side in (subject, low, high):
            found = _operand_type(side, values)
            if found is not None and found not in ORDERED_TYPES:
                raise ExpressionError(
                    f"Invalid {kind}: Incorrect operand type for operator or function; "
                    f"operator or function: BETWEEN, operand type: {found}"
                )
        if low.value is not None and high.value is not None:
            lo, hi = values[low.value], values[high.value]
            if type_of(lo) == type_of(hi) and compare(">", lo, hi):
                raise ExpressionError(
                    f"Invalid {kind}: The BETWEEN operator requires upper bound to be greater "
                    f"than or equal to lower bound; lower bound operand: AttributeValue: "
                    f"{describe(lo)}, upper bound operand: AttributeValue: {describe(hi)}"
                )

    return check


def _begins_with_check(parser: _Parser, operand: _Operand) -> StaticCheck:
    kind = parser.kind

    def check(names: Names, values: Values) -> None:
        found = _operand_type(operand, values)
        if found is not None and found not in ("S", "B"):
            raise ExpressionError(
                f"Invalid {kind}: Incorrect operand type for operator or function; operator "
                f"or function: begins_with, operand type: {found}"
            )

    return check


def _type_name_check(parser: _Parser, placeholder: str) -> StaticCheck:
    kind = parser.kind

    def check(names: Names, values: Values) -> None:
        wanted = values[placeholder]
        if type_of(wanted) != "S" or wanted["S"] not in TYPES:
            shown = wanted.get("S", describe(wanted))
            raise ExpressionError(
                f"Invalid {kind}: Invalid attribute type name found; type: {shown}, valid "
                "types: {N,BS,L,B,NULL,M,S,SS,NS,BOOL}"
            )

    return check


def _set_operand_check(parser: _Parser, clause: str, placeholder: str) -> StaticCheck:
    allowed = ("N", *sorted(SET_TYPES)) if clause == "ADD" else tuple(sorted(SET_TYPES))

    def check(names: Names, values: Values) -> None:
        found = type_of(values[placeholder])
        if found not in allowed:
            raise ExpressionError(
                "Invalid UpdateExpression: Incorrect operand type for operator or function; "
                f"operator: {clause}, operand type: {LONG_NAMES[found]}, typeSet: "
                f"ALLOWED_FOR_{clause}_OPERAND"
            )

    return check


def _number_operand_check(parser: _Parser, operand: _Operand, sign: str) -> StaticCheck:
    def check(names: Names, values: Values) -> None:
        found = _operand_type(operand, values)
        if found is not None and found != "N":
            raise ExpressionError(
                "Invalid UpdateExpression: Incorrect operand type for operator or function; "
                f"operator or function: {sign}, operand type: {found}"
            )

    return check


def _list_operand_check(parser: _Parser, operand: _Operand) -> StaticCheck:
    def check(names: Names, values: Values) -> None:
        found = _operand_type(operand, values)
        if found is not None and found != "L":
            raise ExpressionError(
                "Invalid UpdateExpression: Incorrect operand type for operator or function; "
                f"operator or function: list_append, operand type: {found}"
            )

    return check


# --- whole requests, for the rule tests ----------------------------------------------------


def check_key_update(touched: Sequence[str], key_attributes: Iterable[str]) -> None:
    keys = set(key_attributes)
    for name in touched:
        if name in keys:
            raise ExpressionError(
                f"One or more parameter values were invalid: Cannot update attribute {name}. "
                "This attribute is part of the key"
            )


def holds(
    condition: str,
    item: Item | None,
    names: Mapping[str, str],
    values: Mapping[str, Any],
    *,
    all_used: bool = True,
) -> bool:
    """Whether ``condition`` holds for ``item`` (None: there is no item)."""
    checked_names = validate_names(names)
    checked_values = validate_values(values)
    parsed = parse_condition(condition)
    parsed.bind(checked_names, checked_values)
    if all_used:
        check_all_used([parsed], checked_names, checked_values)
    return parsed.test(canonical_item(item or {}), checked_names, checked_values)


def apply(
    update_expression: str,
    condition_expression: str,
    names: Mapping[str, str],
    values: Mapping[str, Any],
    item: Item | None,
    *,
    key_attributes: Iterable[str] = KEY_ATTRIBUTES,
) -> Item | None:
    """One conditional ``UpdateItem``: the item after it, or None when the condition
    fails (the item is then unchanged). Both expressions are checked in full either
    way, so a malformed or unused placeholder fails whatever the item; an update that
    cannot be applied to the item (a ``SET`` reading a missing attribute) fails only
    when the condition holds, as in DynamoDB."""
    checked_names = validate_names(names)
    checked_values = validate_values(values)
    check = parse_condition(condition_expression)
    change = parse_update(update_expression)
    check.bind(checked_names, checked_values)
    change.bind(checked_names, checked_values)
    touched = change.touched(checked_names)
    check_all_used([check, change], checked_names, checked_values)
    check_key_update(touched, key_attributes)
    old = canonical_item(item or {})
    if not check.test(old, checked_names, checked_values):
        return None
    return change.apply(old, checked_names, checked_values)


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
