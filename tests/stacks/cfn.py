"""Small readers of a synthesized CloudFormation template (plain dicts)."""

from __future__ import annotations

import json
from typing import Any

Resources = dict[str, Any]


def of_type(resources: Resources, cfn_type: str) -> dict[str, Any]:
    return {k: v for k, v in resources.items() if v["Type"] == cfn_type}


def only(resources: Resources, cfn_type: str) -> tuple[str, dict[str, Any]]:
    """The logical id and properties of the one resource of a type."""
    found = of_type(resources, cfn_type)
    assert len(found) == 1, f"expected one {cfn_type}, found {sorted(found)}"
    ((logical_id, resource),) = found.items()
    return logical_id, resource.get("Properties", {})


ACCOUNT_ROOT: dict[str, Any] = {
    "Fn::Join": [
        "",
        ["arn:", {"Ref": "AWS::Partition"}, ":iam::", {"Ref": "AWS::AccountId"}, ":root"],
    ]
}
"""The deploying account as a principal (``arn:<partition>:iam::<account>:root``)."""


def arn(logical_id: str) -> dict[str, Any]:
    return {"Fn::GetAtt": [logical_id, "Arn"]}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_permissions(resources: Resources, role_id: str) -> set[tuple[str, str]]:
    """Every (action, resource) pair the role is allowed, from all policies attached to
    it; resources are rendered as canonical JSON so intrinsics compare exactly."""
    pairs: set[tuple[str, str]] = set()
    documents = [
        policy["Properties"]["PolicyDocument"]
        for policy in of_type(resources, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"].get("Roles", [])
    ]
    role = resources[role_id]["Properties"]
    documents += [p["PolicyDocument"] for p in role.get("Policies", [])]
    for document in documents:
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow"
            for action in as_list(statement["Action"]):
                for resource in as_list(statement["Resource"]):
                    pairs.add((action, canonical(resource)))
    return pairs


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def grants(actions: list[str], *resources: Any) -> set[tuple[str, str]]:
    return {(action, canonical(resource)) for action in actions for resource in resources}


def bus_put_events_statements(resources: Resources) -> list[dict[str, Any]]:
    """The statements of every event bus policy, each checked to be on the one bus."""
    bus_id, _ = only(resources, "AWS::Events::EventBus")
    policies = of_type(resources, "AWS::Events::EventBusPolicy").values()
    assert all(p["Properties"]["EventBusName"] == {"Ref": bus_id} for p in policies)
    return [p["Properties"]["Statement"] for p in policies]
