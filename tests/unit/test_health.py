import os
import subprocess
import sys
import time

import pytest

from tests.support.timing import scaled
from worker.health import is_healthy, stamp, stamp_age


@pytest.mark.parametrize(
    ("age", "heartbeat", "healthy"),
    [(None, 5, False), (0.0, 5, True), (15.0, 5, True), (15.01, 5, False), (100, 5, False)],
)
def test_is_healthy(age, heartbeat, healthy):
    assert is_healthy(age, heartbeat) is healthy


def test_stamp_and_age(tmp_path):
    path = tmp_path / "alive"
    assert stamp_age(path, time.time()) is None
    stamp(path)
    assert 0 <= stamp_age(path, time.time()) < scaled(5)


def run_check(tmp_path, path, lease="2"):
    env = os.environ | {"HEALTH_FILE": str(path), "LEASE_SECONDS": lease}
    return subprocess.run(
        [sys.executable, "-m", "worker.health"],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )


def test_health_command_fails_when_missing_or_stale(tmp_path):
    path = tmp_path / "alive"
    missing = run_check(tmp_path, path)
    assert missing.returncode == 1
    assert "missing" in missing.stderr
    stamp(path)
    assert run_check(tmp_path, path).returncode == 0
    old = time.time() - 10  # heartbeat 0.5 s: three heartbeats are 1.5 s
    os.utime(path, (old, old))
    stale = run_check(tmp_path, path)
    assert stale.returncode == 1
    assert "old" in stale.stderr
