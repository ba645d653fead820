#!/usr/bin/env bash
# Mutation testing of the safety core (docs/TESTING.md): set up from nothing, run
# mutmut over the lease rules, the lease store, the timings and one connection's
# state and runner, and print the scores. The last line of output is one JSON object:
#   {"killed": K, "survived": S, "equivalent": E, "score": ..., "by_module": {...}}
# Options: --keep (reuse mutants/ and re-test only what changed), --max-children N,
# --score-only (score mutants/ as it is). Exit status 1: a module is under its target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

# The store tests talk to the DynamoDB Local this run starts; no AWS settings of the
# machine may leak into them.
unset AWS_PROFILE AWS_ENDPOINT_URL AWS_ENDPOINT_URL_DYNAMODB AWS_ENDPOINT_URL_SQS \
  AWS_ENDPOINT_URL_CLOUDWATCH POWERTOOLS_SERVICE_NAME
exec .venv/bin/python scripts/mutation.py "$@"
