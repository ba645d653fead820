#!/usr/bin/env bash
# Set up from nothing, then run every check: lint, format, types, all tests (unit,
# DynamoDB Local integration, multi-process fleet tests, stacks) and the offline
# `cdk synth` under cdk-nag.
set -euo pipefail
cd "$(dirname "$0")/.."
# With the image tools: buildah, runc, debootstrap (apt) and the stand-in base (cached
# in ~/.cache/websocket-fleet/), for the image tests in tests/image/.
bash scripts/bootstrap.sh --image-tools
# The image and Lambda asset tests must run here, never skip for want of a tool.
export WSFLEET_REQUIRE_IMAGE_TOOLS=1

export PATH="$PWD/.venv/bin:$PATH"
# Tests start their own DynamoDB Local and moto servers on free ports; make sure no
# AWS settings of the machine leak into them.
unset AWS_PROFILE AWS_ENDPOINT_URL AWS_ENDPOINT_URL_DYNAMODB AWS_ENDPOINT_URL_SQS \
  AWS_ENDPOINT_URL_SECRETS_MANAGER \
  AWS_ENDPOINT_URL_CLOUDWATCH POWERTOOLS_SERVICE_NAME

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
mypy --strict scripts/fleet_image
echo "== worker image: hadolint, and the lock against the pins (regenerated from PyPI)"
python -m scripts.fleet_image lint
python -m scripts.fleet_image check-lock
# The simulator's seeds (docs/TESTING.md, "The simulator") run beside pytest on the
# CPU it leaves idle (SCHED_IDLE: they never take a core from a test), then on both
# cores once pytest is done; then SIM_CI_EXTRA_SEEDS more with the faults drawn from
# a generator of their own (--extra-faults: damaged sessions, feeds restarting their
# numbering, workers slow but alive). SIM_CI_SEEDS=0 leaves them all out.
sim_seeds="${SIM_CI_SEEDS:-500}"
sim_extra_seeds="${SIM_CI_EXTRA_SEEDS:-100}"
sim_log="$(mktemp)"
sim_pid=""
if [ "$sim_seeds" -gt 0 ]; then
  echo "== simulator: $sim_seeds seeds and the regression seeds, then $sim_extra_seeds with" \
    "the extra faults, in the background"
  (
    chrt --idle 0 python -m sim --seeds "$sim_seeds" --first-seed 1 --regressions --skip-open \
      --jobs 2 &&
      { [ "$sim_extra_seeds" -eq 0 ] ||
        chrt --idle 0 python -m sim --seeds "$sim_extra_seeds" --first-seed 300001 \
          --extra-faults --jobs 2; }
  ) >"$sim_log" 2>&1 &
  sim_pid=$!
  trap 'kill "$sim_pid" 2>/dev/null || true' EXIT
fi

echo "== pytest"
pytest "$@"

if [ -n "$sim_pid" ]; then
  echo "== simulator (waiting for its last seeds)"
  if ! wait "$sim_pid"; then
    cat "$sim_log"
    echo "the simulator found violations (each is replayed by: python -m sim --seeds 1 --first-seed SEED -v)"
    exit 1
  fi
  trap - EXIT
  grep '^{' "$sim_log"
fi
echo "== cdk synth (offline, cdk-nag)"
bash scripts/synth.sh
