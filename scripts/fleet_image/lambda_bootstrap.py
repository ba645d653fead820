"""A Lambda runtime's init and invoke phases, for one local environment.

Run by a runtime-like interpreter with ``-I`` (nothing of the caller's path or
environment variables for Python): the task root first on ``sys.path``, as Lambda puts
``/var/task``; the handler imported once (an import error fails every invocation, as
an init error does); then one event per line on stdin, one ``RESULT {json}`` line per
event on stdout. Standard library only: it must import nothing the runtime lacks.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
import uuid
from typing import Any


class Context:
    """The attributes of Lambda's context object that handlers read."""

    def __init__(self, name: str, memory: str, timeout_s: float) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory
        self.aws_request_id = str(uuid.uuid4())
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _error(error: BaseException) -> dict[str, Any]:
    return {
        "errorType": type(error).__name__,
        "errorMessage": str(error),
        "stackTrace": traceback.format_exception(error),
    }


def main(task_root: str, handler_name: str, timeout_s: str) -> int:
    import os

    sys.path.insert(0, task_root)
    module_name, _, function_name = handler_name.rpartition(".")
    try:
        handler = getattr(importlib.import_module(module_name), function_name)
        init_error = None
    except Exception as error:  # an init error: every invocation reports it
        handler, init_error = None, _error(error)
    name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "function")
    memory = os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
    for line in sys.stdin:
        if not line.strip():
            continue
        if handler is None:
            answer = {"ok": False, "result": init_error}
        else:
            try:
                result = handler(json.loads(line), Context(name, memory, float(timeout_s)))
                answer = {"ok": True, "result": result}
            except Exception as error:
                answer = {"ok": False, "result": _error(error)}
        sys.stdout.write("RESULT " + json.dumps(answer, default=str) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
