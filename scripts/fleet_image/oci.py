"""The runc runtime spec that runs an image as a container definition says.

Pure: the image's configuration (``buildah inspect``'s Docker config), the container
definition (:mod:`.task_definition`), the root file system's passwd and group files
and the local additions in, a ``config.json`` out. What ECS on Fargate does and this
does too: ENTRYPOINT/CMD overridden by ``EntryPoint``/``Command``; the image's
environment, then the definition's; ``User`` (a name must exist in the image, as
Docker requires); ``WorkingDirectory``; a read-only root when the definition asks;
the memory limit; Fargate's ``nofile`` default (65535) unless ``Ulimits`` say more;
no capabilities for a non-root user. What differs, on purpose: the host's network (a
task has a network namespace of its own; the local servers listen on loopback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scripts.fleet_image.task_definition import ContainerSpec

MIB: Final = 1 << 20
FARGATE_NOFILE: Final = 65535
# Docker's default capability set: what a root process of a container gets on ECS.
ROOT_CAPABILITIES: Final = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)


class UserError(ValueError):
    """A user or group the image does not have (ECS fails the task the same way)."""


@dataclass(frozen=True, slots=True)
class ImageConfig:
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    user: str
    working_dir: str
    healthcheck: tuple[str, ...] | None
    labels: Mapping[str, str]

    @classmethod
    def from_inspect(cls, inspected: Mapping[str, Any]) -> ImageConfig:
        config = inspected.get("Docker", {}).get("config", {}) or {}
        health = config.get("Healthcheck") or {}
        return cls(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            user=config.get("User") or "",
            working_dir=config.get("WorkingDir") or "/",
            healthcheck=tuple(health["Test"]) if health.get("Test") else None,
            labels=dict(config.get("Labels") or {}),
        )


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    additional_gids: tuple[int, ...]
    home: str


def resolve_user(user: str, passwd: str, group: str) -> Identity:
    """``name``, ``uid``, ``name:group`` or ``uid:gid`` as Docker reads it against the
    image's /etc/passwd and /etc/group. An unknown name fails; a number need not be
    listed (its group is then 0)."""
    name, _, group_part = (user or "0").partition(":")
    entries = [line.split(":") for line in passwd.splitlines() if line.count(":") >= 6]
    match = [e for e in entries if e[0] == name or (name.isdigit() and e[2] == name)]
    if match:
        uid, gid, home = int(match[0][2]), int(match[0][3]), match[0][5]
        user_name = match[0][0]
    elif name.isdigit():
        uid, gid, home, user_name = int(name), 0, "/", ""
    else:
        raise UserError(
            f"unable to find user {name}: no matching entries in the image's passwd file"
        )
    groups = [line.split(":") for line in group.splitlines() if line.count(":") >= 3]
    if group_part:
        found = [
            g for g in groups if g[0] == group_part or (group_part.isdigit() and g[2] == group_part)
        ]
        if found:
            gid = int(found[0][2])
        elif group_part.isdigit():
            gid = int(group_part)
        else:
            raise UserError(
                f"unable to find group {group_part}: no matching entries in the image's group file"
            )
    additional = tuple(
        sorted({int(g[2]) for g in groups if user_name and user_name in g[3].split(",")} - {gid})
    )
    return Identity(uid, gid, additional, home)


def argv(image: ImageConfig, spec: ContainerSpec) -> list[str]:
    """Docker's rule: an entry point given clears the image's CMD as well."""
    entrypoint = list(spec.entry_point) if spec.entry_point is not None else list(image.entrypoint)
    if spec.command is not None:
        command = list(spec.command)
    else:
        command = [] if spec.entry_point is not None else list(image.cmd)
    found = entrypoint + command
    if not found:
        raise ValueError("neither the image nor the container definition gives a command")
    return found


def environment(
    image: ImageConfig, identity: Identity, hostname: str, *layers: Mapping[str, str]
) -> dict[str, str]:
    """The image's variables, HOSTNAME and HOME (as Docker sets them), then each of
    ``layers`` in order, later ones winning."""
    env = dict(item.split("=", 1) for item in image.env if "=" in item)
    env.setdefault("HOSTNAME", hostname)
    env.setdefault("HOME", identity.home or "/")
    for layer in layers:
        env.update(layer)
    return env


def runtime_spec(
    *,
    image: ImageConfig,
    spec: ContainerSpec,
    identity: Identity,
    rootfs: str,
    env: Mapping[str, str],
    hostname: str,
    binds: Sequence[tuple[str, str, bool]] = (),
    cgroups_path: str | None = None,
    max_rlimit: int | None = None,
) -> dict[str, Any]:
    """A runc ``config.json``. ``env`` is the whole environment (:func:`environment`);
    ``binds``: ``(host path, container path, read_only)``; ``max_rlimit``: the host's
    own hard ``nofile`` limit, which a container cannot exceed without privileges this
    host may not grant."""
    capabilities = list(ROOT_CAPABILITIES) if identity.uid == 0 else []
    rlimits = {"RLIMIT_NOFILE": (FARGATE_NOFILE, FARGATE_NOFILE)}
    for ulimit in spec.extra.get("Ulimits", []) or []:
        rlimits[f"RLIMIT_{str(ulimit['Name']).upper()}"] = (
            int(ulimit["SoftLimit"]),
            int(ulimit["HardLimit"]),
        )
    if max_rlimit is not None:
        rlimits = {
            kind: (min(soft, max_rlimit), min(hard, max_rlimit))
            for kind, (soft, hard) in rlimits.items()
        }
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
    ]
    # What Docker and ECS put into every container: the name service files.
    for path in ("/etc/hosts", "/etc/resolv.conf"):
        mounts.append(
            {"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]}
        )
    for source, destination, read_only in binds:
        mounts.append(
            {
                "destination": destination,
                "type": "bind",
                "source": source,
                "options": ["rbind", "ro" if read_only else "rw"],
            }
        )
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    if spec.memory_mib is not None:
        resources["memory"] = {"limit": spec.memory_mib * MIB}
    linux: dict[str, Any] = {
        "resources": resources,
        # No network namespace: the host's (see the module docstring).
        "namespaces": [{"type": kind} for kind in ("pid", "ipc", "uts", "mount", "cgroup")],
        "maskedPaths": [
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/proc/scsi",
        ],
        "readonlyPaths": [
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger",
        ],
    }
    if cgroups_path is not None:
        linux["cgroupsPath"] = cgroups_path
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {
                "uid": identity.uid,
                "gid": identity.gid,
                **(
                    {"additionalGids": list(identity.additional_gids)}
                    if identity.additional_gids
                    else {}
                ),
            },
            "args": argv(image, spec),
            "env": [f"{name}={value}" for name, value in env.items()],
            "cwd": spec.working_directory or image.working_dir or "/",
            "capabilities": {
                kind: capabilities
                for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
            }
            | {"bounding": list(ROOT_CAPABILITIES)},
            "rlimits": [
                {"type": kind, "soft": soft, "hard": hard} for kind, (soft, hard) in rlimits.items()
            ],
            "noNewPrivileges": False,
        },
        "root": {"path": rootfs, "readonly": spec.readonly_root},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }
