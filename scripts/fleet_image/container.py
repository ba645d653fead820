"""One container of the worker image, run by runc as a container definition says.

:class:`Container` makes a working container of the image (its own writable layer),
writes the runtime spec (:mod:`.oci`) into a bundle, and runs ``runc run`` in the
foreground, its output to a log file. The health command runs inside the running
container (``runc exec``, with the container's user and environment), as ECS runs it;
a stop is SIGTERM to the container's PID 1 (``runc kill``), then SIGKILL once the stop
timeout has passed, as ECS stops a task.
"""

from __future__ import annotations

import contextlib
import json
import resource
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from scripts.fleet_image import oci, settings, tools
from scripts.fleet_image.task_definition import ContainerSpec

_POLL_S = 0.2


class ContainerError(RuntimeError):
    """The container could not be run as its definition says; the message says why and
    quotes the end of its log."""


@dataclass(frozen=True, slots=True)
class HealthResult:
    healthy: bool
    exit_code: int
    output: str
    seconds: float
    """From the container's start to this result."""


@dataclass(frozen=True, slots=True)
class StopResult:
    exit_code: int | None
    """None: it did not exit in the stop timeout and was killed."""
    seconds: float
    killed: bool


class Container:
    """Use as a context manager: leaving it removes the container whatever happened."""

    def __init__(
        self,
        image: str,
        spec: ContainerSpec,
        *,
        env: Mapping[str, str],
        log_path: Path | None,
        name: str | None = None,
        binds: Sequence[tuple[str, str, bool]] = (),
    ) -> None:
        self.image = image
        self.spec = spec
        self.name = name or f"{settings.CONTAINER_PREFIX}{spec.name}-{secrets.token_hex(4)}"
        self.log_path = log_path
        self._local_env = dict(env)
        self._binds = list(binds)
        self._process: subprocess.Popen[bytes] | None = None
        self._buildah_container: str | None = None
        self._bundle = settings.cache_dir() / "bundles" / self.name
        self._started_at = 0.0
        self.environment: dict[str, str] = {}
        """The container's whole environment, once started."""
        self.config: dict[str, object] = {}
        """The runtime spec, once started."""

    def __enter__(self) -> Container:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()

    # -- start

    def start(self) -> None:
        image = oci.ImageConfig.from_inspect(tools.inspect_image(self.image))
        container, rootfs = tools.new_container(self.image, self.name)
        self._buildah_container = container
        identity = oci.resolve_user(
            self.spec.user if self.spec.user is not None else image.user,
            _read(rootfs / "etc" / "passwd"),
            _read(rootfs / "etc" / "group"),
        )
        self.environment = oci.environment(image, identity, self.name, self._local_env)
        self.config = oci.runtime_spec(
            image=image,
            spec=self.spec,
            identity=identity,
            rootfs=str(rootfs),
            env=self.environment,
            hostname=self.name,
            binds=self._binds,
            cgroups_path=f"/websocket-fleet/{self.name}",
            max_rlimit=resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        )
        self._bundle.mkdir(parents=True, exist_ok=True)
        (self._bundle / "config.json").write_text(json.dumps(self.config, indent=1))
        argv = tools.runc_argv("run", "--bundle", str(self._bundle), self.name)
        # Its own session: a signal to the caller's process group does not reach runc
        # (which would pass it on); the container is signalled by `runc kill` only.
        if self.log_path is None:
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        self._started_at = time.monotonic()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise ContainerError(f"{self.name} has not been started")
        return self._process

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, size: int = 3000) -> str:
        return self.log()[-size:]

    # -- inside it

    def exec(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        """Run ``argv`` in the running container with its user and environment; exit
        status and output (124 after ``timeout``, as a health check's timeout)."""
        try:
            done = subprocess.run(
                tools.runc_argv("exec", self.name, *argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout:g} s"
        return done.returncode, (done.stdout + done.stderr).strip()

    def wait_healthy(self, deadline: float | None = None) -> HealthResult:
        """Run the definition's health command until it passes, at most until the time
        ECS would have called the container unhealthy (its start period, then its
        retries an interval apart); polled more often than ECS does, so the answer comes
        as soon as it is known. Fails at once if the container exits."""
        check = self.spec.health_check
        if check is None:
            raise ContainerError(
                f"the container definition of {self.spec.name} has no health check"
            )
        limit = check.deadline if deadline is None else deadline
        last = HealthResult(False, -1, "not run yet", 0.0)
        while True:
            if not self.alive():
                raise ContainerError(
                    f"{self.name} exited with {self.process.returncode} before its health "
                    f"check passed; end of its log:\n{self.log_tail()}"
                )
            code, output = self.exec(check.argv(), check.timeout)
            elapsed = time.monotonic() - self._started_at
            last = HealthResult(code == 0, code, output, elapsed)
            if last.healthy or elapsed >= limit:
                return last
            time.sleep(min(_POLL_S * 2, max(0.0, limit - elapsed)))

    # -- stop

    def stop(self, timeout: float | None = None) -> StopResult:
        """SIGTERM to PID 1, up to the definition's stop timeout to exit, then SIGKILL."""
        budget = float(self.spec.stop_timeout if timeout is None else timeout)
        began = time.monotonic()
        self.signal(signal.SIGTERM)
        try:
            code: int | None = self.process.wait(budget)
            killed = False
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            code, killed = None, True
        return StopResult(code, time.monotonic() - began, killed)

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(tools.ToolError):
                tools.run(tools.runc_argv("kill", self.name, sig.name), timeout=10)

    def remove(self) -> None:
        """Kill what still runs, delete the runc container, remove the working
        container and the bundle; quietly, for whatever is already gone."""
        if self._process is not None and self._process.poll() is None:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(10)
        with contextlib.suppress(tools.ToolError):
            tools.run(tools.runc_argv("delete", "--force", self.name), timeout=20)
        if self._buildah_container is not None:
            tools.remove_container(self._buildah_container)
            self._buildah_container = None
        config = self._bundle / "config.json"
        config.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._bundle.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def cleanup() -> list[str]:
    """Remove every container these commands left behind (a SIGKILLed run's); their
    names."""
    removed: list[str] = []
    with contextlib.suppress(tools.ToolError):
        listed = json.loads(tools.run(tools.runc_argv("list", "--format", "json")) or "null") or []
        for entry in listed:
            name = str(entry.get("id", ""))
            if name.startswith(settings.CONTAINER_PREFIX):
                with contextlib.suppress(tools.ToolError):
                    tools.run(tools.runc_argv("delete", "--force", name), timeout=20)
                removed.append(name)
    with contextlib.suppress(tools.ToolError):
        for line in tools.buildah("containers", "--format", "{{.ContainerName}}").splitlines():
            if line.startswith(settings.CONTAINER_PREFIX):
                tools.remove_container(line)
                removed.append(line)
    return removed
