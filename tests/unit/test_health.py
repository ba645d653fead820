import os
import subprocess
import sys
import time

import pytest

from tests.support.timing import scaled
from worker.health import is_healthy, stamp, stamp_age


@pytest.mark.parametrize(
    ("age", "stale_after", "healthy"),
    [
        (None, 10.0, False),  # no stamp at all
        (0.0, 10.0, True),
        (-1.0, 10.0, True),  # stamped "in the future" by a clock step: still a stamp
        (9.99, 10.0, True),
        (10.0, 10.0, True),  # at the limit
        (10.01, 10.0, False),
        (100, 10.0, False),
        (14.4, 14.4, True),
        (14.41, 14.4, False),
    ],
)
def test_is_healthy(age, stale_after, healthy):
    assert is_healthy(age, stale_after) is healthy


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
    # lease 2: three heartbeats are 1.44 s, but the limit is never under 10 s
    five_seconds_ago = time.time() - 5
    os.utime(path, (five_seconds_ago, five_seconds_ago))
    assert run_check(tmp_path, path).returncode == 0
    old = time.time() - 60
    os.utime(path, (old, old))
    stale = run_check(tmp_path, path)
    assert stale.returncode == 1
    assert "s old (limit 10.0 s)" in stale.stderr
