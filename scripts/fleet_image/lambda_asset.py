"""The router's Lambda asset, run as Lambda would run it.

Taken from a synthesized template: the function's handler, runtime, environment and
asset directory. It runs on a virtualenv of the runtime's Python version holding only
what the runtime and the Powertools layer provide (boto3 and botocore at the pins;
Powertools and pydantic at the layer's version, the pins), nothing of this project's
environment: an import the asset needs and lacks fails. The asset is the task root,
first on the path, as ``/var/task`` is; :mod:`.lambda_bootstrap` imports the handler
and answers events, one JSON line each.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scripts.fleet_image import settings
from scripts.fleet_image.task_definition import local_environment
from websocket_fleet.sources import pins_of

BOOTSTRAP: Final = Path(__file__).with_name("lambda_bootstrap.py")
PYENV_VERSIONS: Final = Path.home() / ".pyenv" / "versions"
# What the python3.12 runtime and the Powertools layer (python3.12, x86_64) bring: the
# runtime has boto3 (with botocore, jmespath, s3transfer, urllib3, dateutil, six); the
# layer has Powertools and pydantic. Versions: the project's pins of them.
RUNTIME_PACKAGES: Final = ("boto3", "botocore")
LAYER_PACKAGES: Final = ("aws-lambda-powertools", "pydantic")


class LambdaAssetError(RuntimeError):
    """The asset could not be run as Lambda would run it."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    logical_id: str
    handler: str
    runtime: str
    """``python3.12``."""
    asset_dir: Path
    environment: Mapping[str, Any]
    memory_mb: int
    timeout_s: int

    @property
    def python_version(self) -> str:
        match = re.fullmatch(r"python(\d+\.\d+)", self.runtime)
        if match is None:
            raise LambdaAssetError(f"not a Python runtime: {self.runtime}")
        return match.group(1)

    def environment_with(self, supplied: Mapping[str, str]) -> dict[str, str]:
        env, missing = local_environment(self.environment, supplied)
        if missing:
            raise LambdaAssetError("no local value for " + ", ".join(missing))
        return env


def function_spec(template: Mapping[str, Any], outdir: Path, handler: str) -> FunctionSpec:
    """The template's function with ``handler``; its asset from ``outdir`` (cdk.out)."""
    found = [
        (logical_id, resource)
        for logical_id, resource in template.get("Resources", {}).items()
        if resource.get("Type") == "AWS::Lambda::Function"
        and resource.get("Properties", {}).get("Handler") == handler
    ]
    if len(found) != 1:
        raise LambdaAssetError(f"expected one function with handler {handler}, found {len(found)}")
    ((logical_id, resource),) = found
    properties = resource["Properties"]
    # The CLI records the staged folder in the metadata; without it (a synth in
    # process) the folder is named after the asset's hash, the S3 key's stem.
    asset = resource.get("Metadata", {}).get("aws:asset:path")
    if not asset:
        key = str(properties.get("Code", {}).get("S3Key", ""))
        if not key.endswith(".zip"):
            raise LambdaAssetError(f"{logical_id} has no staged asset")
        asset = f"asset.{key.removesuffix('.zip')}"
    return FunctionSpec(
        logical_id=logical_id,
        handler=handler,
        runtime=str(properties["Runtime"]),
        asset_dir=outdir / asset,
        environment=dict(properties.get("Environment", {}).get("Variables", {})),
        memory_mb=int(properties.get("MemorySize", 128)),
        timeout_s=int(properties.get("Timeout", 3)),
    )


def find_python(version: str) -> Path:
    """An interpreter of ``version`` (``3.12``): a pyenv build, or one on PATH (not
    pyenv's shim, which fails for a version that is not selected)."""
    builds = sorted(PYENV_VERSIONS.glob(f"{version}.*/bin/python{version}"))
    if builds:
        return builds[-1]
    on_path = shutil.which(f"python{version}")
    if on_path and "/shims/" not in on_path:
        return Path(on_path)
    raise LambdaAssetError(
        f"no Python {version} (the runtime's) on PATH or under {PYENV_VERSIONS}: install one"
    )


def runtime_requirements(repo_root: Path = settings.REPO_ROOT) -> list[str]:
    """``name==version`` of what the runtime and the layer provide, at the pins."""
    pins = {
        **pins_of((repo_root / "requirements.txt").read_text()),
        **pins_of((repo_root / "worker" / "requirements.txt").read_text()),
    }
    missing = [name for name in (*RUNTIME_PACKAGES, *LAYER_PACKAGES) if name not in pins]
    if missing:
        raise LambdaAssetError(f"no pin for {', '.join(missing)}")
    return [pins[name] for name in (*RUNTIME_PACKAGES, *LAYER_PACKAGES)]


def runtime_venv(version: str, requirements: Sequence[str]) -> Path:
    """A virtualenv of Python ``version`` with exactly ``requirements`` (and what they
    need), made once per set in the cache; its interpreter."""
    key = hashlib.sha256(f"{version}\n{sorted(requirements)}".encode()).hexdigest()[:16]
    venv = settings.cache_dir() / f"lambda-runtime-{version}-{key}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(find_python(version)), "-m", "venv", str(venv)], check=True)
    # The machine's own pip settings (extra indexes, constraints) stay out of it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *requirements],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LambdaAssetError(
            f"pip install {' '.join(requirements)} failed:\n{done.stderr[-3000:]}"
        )
    (venv / ".complete").write_text("\n".join(requirements) + "\n")
    return python


def installed(python: Path) -> set[str]:
    """The distributions of an interpreter's environment, normalised names."""
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {re.sub(r"[-_.]+", "-", d["name"]).lower() for d in json.loads(listing.stdout)}


def lambda_env(
    spec: FunctionSpec, function_env: Mapping[str, str], aws: Mapping[str, str]
) -> dict[str, str]:
    """What Lambda sets for a function (the documented reserved variables), its own
    variables, and the local AWS settings; nothing of this process's environment."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "en_US.UTF-8",
        "TZ": ":UTC",
        "LAMBDA_TASK_ROOT": str(spec.asset_dir),
        "_HANDLER": spec.handler,
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime}",
        "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        **aws,
        **function_env,
    }


@dataclass(frozen=True, slots=True)
class Invocation:
    ok: bool
    result: Any
    """The handler's return value, or the error (``errorType``, ``errorMessage``)."""
    log: str


def invoke(
    python: Path,
    spec: FunctionSpec,
    env: Mapping[str, str],
    events: Sequence[Mapping[str, Any]],
    *,
    timeout: float = 120,
) -> list[Invocation]:
    """Start one Lambda environment (the import, the init phase) and send it
    ``events`` in order. An import that fails fails every invocation with that error."""
    done = subprocess.run(
        [str(python), "-I", str(BOOTSTRAP), str(spec.asset_dir), spec.handler, str(spec.timeout_s)],
        input="".join(json.dumps(event) + "\n" for event in events),
        env=dict(env),
        cwd=spec.asset_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    answers = [
        json.loads(line[len("RESULT ") :])
        for line in done.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    log = done.stdout + done.stderr
    if len(answers) != len(events):
        raise LambdaAssetError(
            f"the runtime answered {len(answers)} of {len(events)} events "
            f"(exit {done.returncode}); its output:\n{log[-4000:]}"
        )
    return [Invocation(bool(a["ok"]), a["result"], log) for a in answers]
