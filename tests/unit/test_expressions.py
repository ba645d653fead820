"""The expression evaluator the rule tests rely on (sim/expressions.py): it must
agree with DynamoDB on the grammar the rules use and refuse what DynamoDB refuses."""

from __future__ import annotations

import pytest

from tests.unit.expressions import ExpressionError, apply, holds, tokenize

NAMES = {"#a": "a", "#b": "b", "#s": "s"}
ITEM = {"a": {"N": "5"}, "b": {"S": "x"}, "s": {"SS": ["p", "q"]}}


@pytest.mark.parametrize(
    ("condition", "values", "expected"),
    [
        ("#a = :v", {":v": {"N": "5"}}, True),
        ("#a = :v", {":v": {"N": "5.0"}}, True),  # numbers compare as numbers
        ("#a <> :v", {":v": {"N": "5"}}, False),
        ("#a < :v", {":v": {"N": "5"}}, False),
        ("#a <= :v", {":v": {"N": "5"}}, True),
        ("#a > :v", {":v": {"N": "4"}}, True),
        ("#a >= :v", {":v": {"N": "6"}}, False),
        ("#a < :v", {":v": {"N": "10"}}, True),  # not as strings ("10" < "5")
        ("#a = :v", {":v": {"S": "5"}}, False),  # across types
        ("#a <> :v", {":v": {"S": "5"}}, True),
        ("#c = :v", {":v": {"N": "5"}}, False),  # a missing attribute equals nothing
        ("#c <> :v", {":v": {"N": "5"}}, True),
        ("#c < :v", {":v": {"N": "5"}}, False),
        ("attribute_exists(#a)", {}, True),
        ("attribute_not_exists(#c)", {}, True),
        ("attribute_not_exists(#a) OR #b = :v", {":v": {"S": "x"}}, True),
        ("attribute_exists(#a) and #b = :v", {":v": {"S": "y"}}, False),  # keywords: any case
        ("NOT #b = :v", {":v": {"S": "y"}}, True),
        (
            "attribute_not_exists(#c) AND (#b = :v OR #a = :w)",
            {":v": {"S": "y"}, ":w": {"N": "5"}},
            True,
        ),
    ],
)
def test_conditions(condition, values, expected):
    names = NAMES | {"#c": "c"}
    used = {k: v for k, v in names.items() if k in condition}
    assert holds(condition, ITEM, used, values) is expected


def test_no_item_is_an_empty_item():
    assert holds("attribute_not_exists(#a)", None, {"#a": "a"}, {})


@pytest.mark.parametrize(
    ("update", "values", "expected"),
    [
        ("SET #a = :v", {":v": {"N": "1"}}, {"a": {"N": "1"}}),
        ("SET #a = #a + :v", {":v": {"N": "2"}}, {"a": {"N": "7"}}),
        ("SET #c = if_not_exists(#c, :v)", {":v": {"N": "0"}}, {"c": {"N": "0"}}),
        ("SET #a = if_not_exists(#a, :v)", {":v": {"N": "0"}}, {}),
        ("REMOVE #a, #c", {}, {"a": None}),
        ("ADD #a :v", {":v": {"N": "1"}}, {"a": {"N": "6"}}),
        ("ADD #c :v", {":v": {"N": "1"}}, {"c": {"N": "1"}}),
        ("ADD #s :v", {":v": {"SS": ["q", "r"]}}, {"s": {"SS": ["p", "q", "r"]}}),
        ("DELETE #s :v", {":v": {"SS": ["q", "z"]}}, {"s": {"SS": ["p"]}}),
        ("DELETE #s :v", {":v": {"SS": ["p", "q"]}}, {"s": None}),  # an empty set is removed
        (
            "SET #b = :v REMOVE #a ADD #c :w",
            {":v": {"S": "y"}, ":w": {"N": "2"}},
            {"a": None, "b": {"S": "y"}, "c": {"N": "2"}},
        ),
    ],
)
def test_updates(update, values, expected):
    names = {k: v for k, v in (NAMES | {"#c": "c"}).items() if k in update}
    new = apply(update, "attribute_exists(#b)", names | {"#b": "b"}, values, ITEM)
    want = {k: v for k, v in (ITEM | expected).items() if v is not None}
    assert new == want


def test_a_failed_condition_writes_nothing():
    assert apply("SET #a = :v", "#a = :v", {"#a": "a"}, {":v": {"N": "6"}}, ITEM) is None


@pytest.mark.parametrize(
    ("update", "condition", "names", "values", "message"),
    [
        (
            "SET #a = :v",
            "attribute_exists(#a)",
            {"#a": "a", "#b": "b"},
            {":v": {"N": "1"}},
            "Value provided in ExpressionAttributeNames unused in expressions: keys: {#b}",
        ),
        (
            "SET #a = :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}, ":w": {"N": "1"}, ":x": {"N": "1"}},
            "Value provided in ExpressionAttributeValues unused in expressions: keys: {:w, :x}",
        ),
        (
            "SET #a = :w",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}},
            "Invalid UpdateExpression: An expression attribute value used in expression is not "
            "defined; attribute value: :w",
        ),
        (
            "SET #x = :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}},
            "Invalid UpdateExpression: An expression attribute name used in the document path "
            "is not defined; attribute name: #x",
        ),
        (
            "SET #a = :v, #a = :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}},
            "Invalid UpdateExpression: Two document paths overlap with each other; must remove "
            "or rewrite one of these paths; path one: [a], path two: [a]",
        ),
        (
            "SET #a = :v REMOVE #a",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}},
            "Invalid UpdateExpression: Two document paths overlap with each other; must remove "
            "or rewrite one of these paths; path one: [a], path two: [a]",
        ),
        (
            "SET #a = :v SET #b = :v",
            "attribute_exists(#a)",
            {"#a": "a", "#b": "b"},
            {":v": {"N": "1"}},
            'Invalid UpdateExpression: The "SET" section can only be used once in an update '
            "expression;",
        ),
        (
            "SET #k = :v",
            "attribute_exists(#a)",
            {"#a": "a", "#k": "Pk"},
            {":v": {"S": "1"}},
            "One or more parameter values were invalid: Cannot update attribute Pk. This "
            "attribute is part of the key",
        ),
        (
            "SET #a = :v",
            "#a = :v :v",
            {"#a": "a"},
            {":v": {"N": "1"}},
            'Invalid ConditionExpression: Syntax error; token: ":v", near: ":v :v"',
        ),
        (
            "SET #a = :v",
            "#a := :v",
            {"#a": "a"},
            {":v": {"N": "1"}},
            'Invalid ConditionExpression: Syntax error; token: ":", near: "#a :="',
        ),
        (
            "PUT #a = :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"N": "1"}},
            'Invalid UpdateExpression: Syntax error; token: "PUT", near: "PUT #a"',
        ),
        (
            "SET #a = :v",
            "#a = ",
            {"#a": "a"},
            {":v": {"N": "1"}},
            'Invalid ConditionExpression: Syntax error; token: "<EOF>", near: "= "',
        ),
        (
            "SET #a = :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"SS": ["a", "a"]}},
            "ExpressionAttributeValues contains invalid value: One or more parameter values "
            "were invalid: Input collection [a, a] contains duplicates for key :v",
        ),
        (
            "ADD #a :v",
            "attribute_exists(#a)",
            {"#a": "a"},
            {":v": {"S": "x"}},
            "Invalid UpdateExpression: Incorrect operand type for operator or function; "
            "operator: ADD, operand type: STRING, typeSet: ALLOWED_FOR_ADD_OPERAND",
        ),
        (
            "SET #a = :v",
            "#a < :v",
            {"#a": "a"},
            {":v": {"SS": ["x"]}},
            "Invalid ConditionExpression: Incorrect operand type for operator or function; "
            "operator or function: <, operand type: SS",
        ),
        (
            "SET #a = #c",
            "attribute_exists(#a)",
            {"#a": "a", "#c": "c"},
            {},
            "The provided expression refers to an attribute that does not exist in the item",
        ),
        (
            "ADD #b :v",
            "attribute_exists(#a)",
            {"#a": "a", "#b": "b"},
            {":v": {"N": "1"}},
            "An operand in the update expression has an incorrect data type",
        ),
    ],
)
def test_what_dynamodb_refuses_is_refused(update, condition, names, values, message):
    """Each message is DynamoDB Local's for the same request."""
    with pytest.raises(ExpressionError) as refused:
        apply(update, condition, names, values, ITEM)
    assert refused.value.message == message


def test_a_failed_condition_comes_before_an_update_that_cannot_apply():
    assert apply("SET #a = #c", "#a = :v", {"#a": "a", "#c": "c"}, {":v": {"N": "6"}}, ITEM) is None


def test_tokens():
    assert tokenize("SET #a = if_not_exists(#a, :z) ADD #b :one") == [
        "SET",
        "#a",
        "=",
        "if_not_exists",
        "(",
        "#a",
        ",",
        ":z",
        ")",
        "ADD",
        "#b",
        ":one",
    ]
