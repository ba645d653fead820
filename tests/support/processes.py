"""Running a module of the project to completion as a child process, in tests."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.timing import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def children_take_sigint() -> Iterator[None]:
    """Start child processes within this block as a terminal would: taking SIGINT.

    A shell starts a background job with SIGINT ignored, and an ignored signal stays
    ignored across fork and exec, so a test run in the background would start
    children that SIGINT cannot stop (Python keeps an ignored SIGINT ignored). A
    handler, unlike an ignore, is reset to the default by exec: one is set for the
    time of the start."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupt(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT (our runners then stop their children in order), SIGKILL after 30 s."""
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=scaled(30))
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


def run_module(
    module: str, args: list[str], timeout: float, *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` to completion (with ``env`` if given, else this
    process's environment). On a hang, or when the test itself is interrupted, the
    child is stopped first, so a broken run leaks no servers."""
    with children_take_sigint():
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO_ROOT,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = interrupt(process)
        pytest.fail(f"python -m {module} still running after {timeout} s\n{out}\n{err}")
    except BaseException:  # the test's own timeout, Ctrl-C: stop the child first
        interrupt(process)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
