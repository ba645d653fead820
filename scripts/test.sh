#!/usr/bin/env bash
# Set up from nothing, then run every check: lint, format, types, all tests (unit,
# DynamoDB Local integration, multi-process fleet tests, stacks) and the offline
# `cdk synth` under cdk-nag.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

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
echo "== pytest"
pytest "$@"
echo "== cdk synth (offline, cdk-nag)"
bash scripts/synth.sh
