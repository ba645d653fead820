#!/usr/bin/env bash
# Set up from nothing, then run the whole system locally: DynamoDB Local, moto (SQS,
# CloudWatch), the demo feed and a few workers, with a live view. Ctrl-C stops it all.
# Options are passed on to `python -m local_stack` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m local_stack "$@"
