"""``scripts/image.sh``: build the worker image and run what a deploy ships.

base                      make the local stand-in base unless it is current
build [--handler-dir DIR] build the image from worker/Dockerfile over the staged context
run [--template T] ...    run the image as the template's task definition says, against
                          a local stack (run-local.sh's by default), until Ctrl-C
lint                      hadolint worker/Dockerfile
lock | check-lock         write / verify worker/requirements.lock
pin-base [--digest D]     pin the Dockerfile's FROM by digest
cleanup                   remove containers a killed run left behind
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.fleet_image import base, build, container, lock, settings, tools
from scripts.fleet_image.task_definition import ContainerSpec, TaskDefinitionError, container_spec

DOCKERFILE = settings.REPO_ROOT / "worker" / "Dockerfile"
DEFAULT_TEMPLATE = settings.REPO_ROOT / "cdk.out" / "WebSocketFleet-prod.template.json"
OFFICIAL_BASE = "public.ecr.aws/docker/library/python:3.11-slim"
FROM_LINE = re.compile(r"^FROM (\S+?)(@sha256:[0-9a-f]{64})?$", re.MULTILINE)


def _say(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def _require_tools() -> None:
    missing = tools.missing_tools()
    if missing:
        raise SystemExit(f"image: missing {', '.join(missing)}: run scripts/image-tools.sh")


def cmd_base(args: argparse.Namespace) -> int:
    _require_tools()
    if not base.ensure(args.mirror):
        _say(f"stand-in base {settings.STANDIN_IMAGE} is current (recipe {base.recipe_key()})")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    _require_tools()
    if args.base == settings.STANDIN_IMAGE:
        base.ensure()
    built = build.build(handler_dir=args.handler_dir, tag=args.tag, base=args.base, quiet=False)
    print(
        json.dumps({"image": built.name, "id": built.image_id, "seconds": round(built.seconds, 1)})
    )
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    hadolint = Path(sys.executable).with_name("hadolint")
    if not hadolint.exists():
        raise SystemExit(f"image: {hadolint} is missing: run scripts/bootstrap.sh")
    done = subprocess.run([str(hadolint), str(DOCKERFILE)], check=False)
    if done.returncode == 0:
        _say("hadolint: worker/Dockerfile passes")
    return done.returncode


def cmd_lock(args: argparse.Namespace) -> int:
    path = lock.generate()
    _say(f"wrote {path.relative_to(settings.REPO_ROOT)}")
    return 0


def cmd_check_lock(args: argparse.Namespace) -> int:
    problems = lock.pin_mismatches(lock.PINS.read_text(), lock.LOCK.read_text())
    for problem in problems:
        _say(f"lock: {problem}")
    if problems:
        _say("regenerate it: scripts/image.sh lock")
        return 1
    if args.offline:
        _say("lock: holds every pin, every entry hashed")
        return 0
    diff = lock.check()
    if diff is not None:
        sys.stderr.write(diff)
        _say("lock: out of date with the pins; regenerate it: scripts/image.sh lock")
        return 1
    _say("lock: regenerated from the pins, it is the same")
    return 0


def resolve_digest(reference: str) -> str:
    """The registry's digest of ``reference``, by skopeo or crane (whichever is here)."""
    if shutil.which("skopeo"):
        argv = ["skopeo", "inspect", "--format", "{{.Digest}}", f"docker://{reference}"]
    elif shutil.which("crane"):
        argv = ["crane", "digest", reference]
    else:
        raise SystemExit("image: neither skopeo nor crane is installed (apt-get install skopeo)")
    digest = subprocess.run(
        argv, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise SystemExit(f"image: {' '.join(argv)} gave {digest!r}, not a digest")
    return digest


def pin_from_line(dockerfile: str, digest: str) -> str:
    """The Dockerfile with its FROM pinned to ``digest`` (the tag kept, for readers)."""
    match = FROM_LINE.search(dockerfile)
    if match is None:
        raise ValueError("no FROM line to pin")
    return (
        dockerfile[: match.start()] + f"FROM {match.group(1)}@{digest}" + dockerfile[match.end() :]
    )


def cmd_pin_base(args: argparse.Namespace) -> int:
    text = DOCKERFILE.read_text()
    match = FROM_LINE.search(text)
    if match is None:
        raise SystemExit("image: worker/Dockerfile has no FROM line")
    digest = args.digest or resolve_digest(match.group(1))
    DOCKERFILE.write_text(pin_from_line(text, digest))
    _say(f"FROM {match.group(1)}@{digest}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    for name in container.cleanup():
        _say(f"removed {name}")
    return 0


def local_aws(dynamodb: str, moto: str) -> dict[str, str]:
    from local_stack.process_env import Endpoints, local_aws_settings

    return local_aws_settings(Endpoints(dynamodb, moto))


def queue_url_of(moto: str, queue: str) -> str:
    from local_stack.fleet import CLIENT_CONFIG
    from local_stack.services import local_client

    client = local_client("sqs", moto, config=CLIENT_CONFIG)
    try:
        return str(client.get_queue_url(QueueName=queue)["QueueUrl"])
    finally:
        client.close()


def cmd_run(args: argparse.Namespace) -> int:
    _require_tools()
    from worker import config as worker_settings

    template_path: Path = args.template
    if not template_path.exists():
        raise SystemExit(
            f"image: {template_path} is missing: run scripts/synth.sh (with your context)"
        )
    template: dict[str, Any] = json.loads(template_path.read_text())
    spec = container_spec(template, args.container)
    supplied = {
        worker_settings.TABLE_NAME: args.table,
        worker_settings.QUEUE_URL: args.queue_url or queue_url_of(args.moto, args.queue),
    }
    for item in args.set:
        name, _, value = item.partition("=")
        supplied[name] = value
    try:
        env = {**local_aws(args.dynamodb, args.moto), **spec.environment_with(supplied)}
    except TaskDefinitionError as error:
        raise SystemExit(f"image: {error}") from None
    extra = {k: v for k, v in supplied.items() if k not in spec.environment}
    env.update(extra)
    _say(f"running {args.image} as {template_path.name}'s container {spec.name!r}")
    log = args.log or settings.cache_dir() / "logs" / f"{spec.name}-{os.getpid()}.log"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with container.Container(args.image, spec, env=env, log_path=log) as running:
        running.start()
        _say(f"container {running.name}, log {log}")
        health = running.wait_healthy()
        if not health.healthy:
            _say(f"unhealthy after {health.seconds:.1f} s: {health.output}")
            return 1
        _say(f"healthy after {health.seconds:.1f} s: the health command passed")
        until = time.monotonic() + args.duration if args.duration else None
        while not stop.is_set() and running.alive():
            if until is not None and time.monotonic() >= until:
                break
            stop.wait(0.5)
        if not running.alive():
            code = running.process.returncode
            _say(f"exited by itself with {code}; end of its log:\n{running.log_tail()}")
            return 1
        result = running.stop()
        _say(
            f"SIGTERM: exit {result.exit_code} after {result.seconds:.1f} s "
            f"(stop timeout {spec.stop_timeout} s{', killed' if result.killed else ''})"
        )
        return 0 if result.exit_code == 0 else 1


def cmd_worker_shim(args: argparse.Namespace) -> int:
    """Stands in for the interpreter the local stack starts workers with
    (``<shim> -m worker``): the worker runs in a container of the image instead, with
    the worker's variables of this process's environment and its health file's
    folder shared, so the local stack sees its stamp."""
    from worker import config as worker_settings

    if args.argv != ["-m", "worker"]:
        print(f"worker-shim: expected `-m worker`, got {args.argv}", file=sys.stderr)
        return 2
    env = container_env(os.environ, args.pass_env)
    binds = []
    health = os.environ.get(worker_settings.HEALTH_FILE)
    if health:
        folder = Path(health).parent
        folder.mkdir(parents=True, exist_ok=True)
        # The image's user is not this one: the folder must take its stamp.
        folder.chmod(
            folder.stat().st_mode | stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO | stat.S_ISVTX
        )
        binds.append((str(folder), str(folder), False))
    spec = ContainerSpec(
        name="worker",
        entry_point=None,
        command=None,
        user=None,
        working_directory=None,
        environment={},
        health_check=None,
        stop_timeout=120,
        readonly_root=False,
        memory_mib=None,
    )
    worker_id = os.environ.get(worker_settings.WORKER_ID, "worker")
    name = f"{settings.CONTAINER_PREFIX}{re.sub(r'[^A-Za-z0-9_.-]', '-', worker_id)}-{os.getpid()}"
    terminated = threading.Event()
    with container.Container(
        args.image, spec, env=env, log_path=None, name=name, binds=binds
    ) as running:

        def forward(signum: int, frame: object) -> None:
            # One SIGTERM reaches the worker, however often the local stack signals.
            if not terminated.is_set():
                terminated.set()
                running.signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        running.start()
        return running.process.wait()


PASSED_PREFIXES = ("AWS_", "POWERTOOLS_", "SINK_")


def container_env(
    environ: dict[str, str] | os._Environ[str], pass_env: Sequence[str]
) -> dict[str, str]:
    """What a local worker's environment gives its container: the worker's own
    variables, AWS's and the sinks', and the names asked for; never the host's paths
    (PATH, PYTHONPATH, HOME: the image has its own)."""
    from worker import config as worker_settings
    from wsfleet.protocol_registry import UPSTREAM_PROTOCOLS

    known = set(worker_settings.SETTINGS) | {UPSTREAM_PROTOCOLS} | set(pass_env)
    return {
        name: value
        for name, value in environ.items()
        if name in known or name.startswith(PASSED_PREFIXES)
    }


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="scripts/image.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("base", help="make the local stand-in base unless it is current")
    sub.add_argument("--mirror", help="Debian mirror (default: the one apt uses)")
    sub.set_defaults(run=cmd_base)
    sub = commands.add_parser("build", help="build the worker image (cached layers)")
    sub.add_argument("--handler-dir", type=Path, help="a handler directory to build in")
    sub.add_argument("--tag", default=settings.WORKER_IMAGE)
    sub.add_argument(
        "--base",
        default=settings.STANDIN_IMAGE,
        help="the FROM image (default: the local stand-in)",
    )
    sub.set_defaults(run=cmd_build)
    sub = commands.add_parser("run", help="run the image as the template's task definition says")
    sub.add_argument("--image", default=settings.WORKER_IMAGE)
    sub.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE)
    sub.add_argument("--container", default="worker")
    sub.add_argument(
        "--dynamodb", default="http://127.0.0.1:8000", help="DynamoDB endpoint (run-local.sh's)"
    )
    sub.add_argument(
        "--moto", default="http://127.0.0.1:5000", help="moto endpoint: SQS, Secrets Manager"
    )
    sub.add_argument("--table", default="connections")
    sub.add_argument("--queue", default="websocket-fleet-starts", help="the start queue's name")
    sub.add_argument("--queue-url", help="instead of --queue")
    sub.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a variable's local value"
    )
    sub.add_argument("--duration", type=float, help="stop it (SIGTERM) after this many seconds")
    sub.add_argument("--log", type=Path)
    sub.set_defaults(run=cmd_run)
    sub = commands.add_parser("lint", help="hadolint worker/Dockerfile")
    sub.set_defaults(run=cmd_lint)
    sub = commands.add_parser("lock", help="regenerate worker/requirements.lock from the pins")
    sub.set_defaults(run=cmd_lock)
    sub = commands.add_parser("check-lock", help="the lock holds the pins and regenerates the same")
    sub.add_argument("--offline", action="store_true", help="only compare the pins with the lock")
    sub.set_defaults(run=cmd_check_lock)
    sub = commands.add_parser("pin-base", help="pin the Dockerfile's FROM by digest")
    sub.add_argument("--digest", help="sha256:...; default: resolved by skopeo or crane")
    sub.set_defaults(run=cmd_pin_base)
    sub = commands.add_parser("cleanup", help="remove containers a killed run left behind")
    sub.set_defaults(run=cmd_cleanup)
    sub = commands.add_parser("worker-shim", help=argparse.SUPPRESS)
    sub.add_argument("--image", default=settings.WORKER_IMAGE)
    sub.add_argument("--pass-env", action="append", default=[])
    sub.add_argument("argv", nargs=argparse.REMAINDER)
    sub.set_defaults(run=cmd_worker_shim)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "argv", None) and args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    try:
        code: int = args.run(args)
    except (
        tools.ToolError,
        lock.LockError,
        TaskDefinitionError,
        container.ContainerError,
    ) as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
