"""Run a handler once, as a worker would, and say in words what failed.

Run by ``fleetctl check-handler`` (:mod:`fleetctl.check_handler`) with the source of
this file (``python -c``) in a throwaway virtualenv that holds the worker's pins and
the handler's requirements, its working directory a staged image context (``worker/``,
``wsfleet/``, ``handler/``) with ``handler/`` on ``PYTHONPATH``: the image's layout.
So it imports only the standard library and the worker.

    probe FACTORY PAYLOAD_JSON TIMEOUT_SECONDS

Each step prints ``<step>: ok: ...`` or ``<step>: failed: ...`` and the last line says
``ok`` or ``failed``; the exit status is 0 or 1.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from worker.delivery import BatchHandler, Delivery, Handler, batch_call


class ProbeFailedError(Exception):
    """A step failed; the message says why."""


def say(step: str, text: str) -> None:
    print(f"{step}: {text}", flush=True)


def failed(step: str, text: str) -> NoReturn:
    say(step, f"failed: {text}")
    raise ProbeFailedError(text)


def where(error: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame of the handler's own code."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if "/handler/" in frame.filename
    ]
    if not frames:
        return ""
    frame = frames[-1]
    path = frame.filename.split("/handler/", 1)[1]
    return f" (at {path}:{frame.lineno})"


def described(error: BaseException) -> str:
    """``KeyError (at pkg/mod.py:12): 'price'``; a message of several lines goes on
    indented below its first."""
    first, *rest = (str(error) or "(no message)").splitlines()
    return "\n".join(
        [f"{type(error).__name__}{where(error)}: {first}", *(f"    {r}" for r in rest)]
    )


def signature(function: Callable[..., Any]) -> str:
    """``(table, retries=3)``: the parameters as the caller sees them, no annotations."""
    try:
        found = inspect.signature(function)
    except ValueError:
        return "(...)"
    plain = [p.replace(annotation=inspect.Parameter.empty) for p in found.parameters.values()]
    return str(found.replace(parameters=plain, return_annotation=inspect.Signature.empty))


def import_module(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or str(error)
        if module_name == missing or module_name.startswith(f"{missing}."):
            failed(
                "import",
                f"no module {module_name!r} in the handler directory (it needs "
                f"{missing.replace('.', '/')}/ or {missing.replace('.', '/')}.py)",
            )
        failed(
            "import",
            f"missing dependency: {module_name} imports {missing!r}, which is not "
            f"installed: add the package that provides it to the handler's "
            f"requirements.txt{where(error)}",
        )
    except Exception as error:
        failed("import", f"importing {module_name} raised {described(error)}")


def make_handler(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    module = import_module(module_name)
    say("import", f"ok: {module_name}")
    factory = getattr(module, attr, None)
    if factory is None:
        failed("factory", f"{module_name} has no {attr!r}")
    if not callable(factory):
        failed("factory", f"{module_name}.{attr} is not callable: {factory!r}")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        failed(
            "factory",
            f"wrong signature: the worker calls {attr}() with no arguments, but "
            f"{module_name}.{attr}{signature(factory)} needs some",
        )
    except ValueError:
        pass  # no signature to read (a builtin): calling it will tell
    try:
        handler = factory()
    except Exception as error:
        failed("factory", f"{attr}() raised {described(error)}")
    say("factory", f"ok: {attr}() returned a {type(handler).__module__}.{type(handler).__name__}")
    return handler


def handler_method(handler: Any) -> tuple[str, Callable[..., Any]]:
    """``handle_batch`` when there is one (the worker prefers it), else ``handle``."""
    if not isinstance(handler, Handler | BatchHandler):
        failed(
            "handler",
            f"{handler!r} has neither async handle(self, delivery) nor async "
            "handle_batch(self, deliveries)",
        )
    call = batch_call(handler)
    name = "handle_batch" if call is not None else "handle"
    method: Callable[..., Any] = getattr(handler, name)
    argument = "deliveries" if name == "handle_batch" else "delivery"
    if not inspect.iscoroutinefunction(method):
        failed(
            "handler",
            f"wrong signature: {name} must be `async def {name}(self, {argument})`; "
            "it is not a coroutine function",
        )
    try:
        inspect.signature(method).bind(None)
    except TypeError:
        failed(
            "handler",
            f"wrong signature: the worker calls {name}({argument}) with one argument, but "
            f"it is {name}{signature(method)}",
        )
    kind = "a batch handler" if name == "handle_batch" else "one delivery per call"
    say("handler", f"ok: async {name}({argument}): {kind}")
    return name, method


async def deliver(name: str, method: Callable[..., Any], payload: Any, seconds: float) -> None:
    def delivery(seq: int) -> Delivery:
        return Delivery(
            connection_id="check-handler",
            epoch=1,
            seq=seq,
            payload=payload,
            worker_id="check-handler",
            seq_gen=0,
        )

    argument: Any = [delivery(1), delivery(2)] if name == "handle_batch" else delivery(1)
    shown = "a batch of 2 sample deliveries" if name == "handle_batch" else "a sample delivery"
    try:
        async with asyncio.timeout(seconds):
            await method(argument)
    except TimeoutError:
        failed("delivery", f"{name} did not return within {seconds:g} s")
    except Exception as error:
        failed("delivery", f"{name} raised on {shown}: {described(error)}")
    say("delivery", f"ok: {name} returned for {shown}")


def main(argv: list[str]) -> int:
    spec, payload_json, timeout = argv[0], argv[1], float(argv[2])
    try:
        handler = make_handler(spec)
        name, method = handler_method(handler)
        asyncio.run(deliver(name, method, json.loads(payload_json), timeout))
    except ProbeFailedError:
        print("failed", flush=True)
        return 1
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
