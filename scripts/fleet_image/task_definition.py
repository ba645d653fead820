"""One container of a synthesized ECS task definition, as ECS reads it.

Pure: takes the template (a dict) and returns what a run needs: the command, the user,
the environment (values the template leaves to CloudFormation, such as ``Ref``s of the
table and the queue, are supplied by the caller, by name), the health check, the stop
timeout, a read-only root file system and the memory. A name a run does not supply
fails here, naming the variable and what the template says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

TASK_DEFINITION: Final = "AWS::ECS::TaskDefinition"
DEFAULT_STOP_TIMEOUT: Final = 30
"""What ECS gives a container after SIGTERM when ``StopTimeout`` is not set."""
# ECS's defaults for the fields of a container health check left out.
HEALTH_DEFAULTS: Final = {"Interval": 30, "Timeout": 5, "Retries": 3, "StartPeriod": 0}


class TaskDefinitionError(ValueError):
    """The template has no such container, or a value a run cannot use."""


@dataclass(frozen=True, slots=True)
class HealthCheck:
    command: tuple[str, ...]
    """``CMD`` and its arguments, or ``CMD-SHELL`` and one command line."""
    interval: float
    timeout: float
    retries: int
    start_period: float

    def argv(self) -> list[str]:
        """The process ECS runs in the container."""
        kind, *rest = self.command
        if kind == "CMD":
            return list(rest)
        if kind == "CMD-SHELL":
            return ["/bin/sh", "-c", " ".join(rest)]
        raise TaskDefinitionError(
            f"a health check command starts with CMD or CMD-SHELL, not {kind!r}"
        )

    @property
    def deadline(self) -> float:
        """How long after the start ECS waits at most before it calls the container
        unhealthy: the start period, then ``retries`` failures ``interval`` apart."""
        return self.start_period + self.interval * self.retries + self.timeout


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    entry_point: tuple[str, ...] | None
    """None: the image's ENTRYPOINT."""
    command: tuple[str, ...] | None
    """None: the image's CMD."""
    user: str | None
    """None: the image's USER."""
    working_directory: str | None
    environment: Mapping[str, Any]
    """As in the template: a string, or an intrinsic (``{"Ref": ...}``) to supply."""
    health_check: HealthCheck | None
    stop_timeout: int
    readonly_root: bool
    memory_mib: int | None
    """The container's hard limit, else the task's memory (Fargate), else None."""
    family: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other fields of the definition (not used by a local run), for the record."""

    def environment_with(self, supplied: Mapping[str, str]) -> dict[str, str]:
        """The container's variables, each value the template's own string or, for one
        it leaves to CloudFormation, the one ``supplied`` under its name."""
        env, missing = local_environment(self.environment, supplied)
        if missing:
            raise TaskDefinitionError(
                "no local value for " + ", ".join(missing) + ": the template leaves them to "
                "CloudFormation; supply them by name"
            )
        return env


def local_environment(
    environment: Mapping[str, Any], supplied: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """A template's variables made local: each the template's own string or, for one it
    leaves to CloudFormation (a reference, a join), the one ``supplied`` under its
    name; and those of the latter that nothing supplied, described."""
    env: dict[str, str] = {}
    missing: list[str] = []
    for name, value in environment.items():
        if name in supplied:
            env[name] = supplied[name]
        elif isinstance(value, str):
            env[name] = value
        else:
            missing.append(f"{name} ({json.dumps(value)})")
    return env, missing


_USED: Final = frozenset(
    {
        "Name",
        "EntryPoint",
        "Command",
        "User",
        "WorkingDirectory",
        "Environment",
        "HealthCheck",
        "StopTimeout",
        "ReadonlyRootFilesystem",
        "Memory",
        "MemoryReservation",
    }
)


def task_definitions(template: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {
        logical_id: resource.get("Properties", {})
        for logical_id, resource in template.get("Resources", {}).items()
        if resource.get("Type") == TASK_DEFINITION
    }


def container_spec(template: Mapping[str, Any], container: str = "worker") -> ContainerSpec:
    """The container named ``container`` of the template's only task definition that
    has one."""
    found = [
        (properties, definition)
        for properties in task_definitions(template).values()
        for definition in properties.get("ContainerDefinitions", [])
        if definition.get("Name") == container
    ]
    if len(found) != 1:
        raise TaskDefinitionError(
            f"expected one container named {container!r} in the template's task "
            f"definitions, found {len(found)}"
        )
    ((task, definition),) = found
    return ContainerSpec(
        name=container,
        entry_point=_strings(definition, "EntryPoint"),
        command=_strings(definition, "Command"),
        user=_optional_string(definition, "User"),
        working_directory=_optional_string(definition, "WorkingDirectory"),
        environment=_environment(definition),
        health_check=_health_check(definition.get("HealthCheck")),
        stop_timeout=int(definition.get("StopTimeout", DEFAULT_STOP_TIMEOUT)),
        readonly_root=bool(definition.get("ReadonlyRootFilesystem", False)),
        memory_mib=_memory(definition, task),
        family=str(task.get("Family", "")),
        extra={key: value for key, value in definition.items() if key not in _USED},
    )


def _strings(definition: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = definition.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskDefinitionError(f"{key} must be a list of strings here, got {value!r}")
    return tuple(value)


def _optional_string(definition: Mapping[str, Any], key: str) -> str | None:
    value = definition.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskDefinitionError(f"{key} must be a string here, got {value!r}")
    return value


def _environment(definition: Mapping[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for entry in definition.get("Environment", []):
        name = entry["Name"]
        if name in env:
            raise TaskDefinitionError(f"the variable {name} is set twice")
        env[name] = entry["Value"]
    return env


def _health_check(raw: Mapping[str, Any] | None) -> HealthCheck | None:
    if raw is None:
        return None
    merged = {**HEALTH_DEFAULTS, **raw}
    command = merged.get("Command")
    if not isinstance(command, list) or len(command) < 2:
        raise TaskDefinitionError(f"a health check needs a command, got {command!r}")
    return HealthCheck(
        command=tuple(str(part) for part in command),
        interval=float(merged["Interval"]),
        timeout=float(merged["Timeout"]),
        retries=int(merged["Retries"]),
        start_period=float(merged["StartPeriod"]),
    )


def _memory(definition: Mapping[str, Any], task: Mapping[str, Any]) -> int | None:
    for raw in (definition.get("Memory"), task.get("Memory")):
        if raw is not None:
            try:
                return int(raw)
            except (TypeError, ValueError):
                raise TaskDefinitionError(f"memory must be a number of MiB, got {raw!r}") from None
    return None
