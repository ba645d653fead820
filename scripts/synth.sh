#!/usr/bin/env bash
# Synthesize the CDK app offline into cdk.out, exactly as `cdk deploy` would, with
# AWS's Solutions rule pack (cdk-nag) applied: any unacknowledged finding fails it.
# Needs no AWS credentials and no Docker (assets are only staged).
# Extra arguments go to `cdk synth`, e.g. scripts/synth.sh -c fleet:environment=dev
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ] || [ ! -x node_modules/.bin/cdk ]; then
  echo "synth: .venv or the CDK CLI is missing; run scripts/bootstrap.sh first" >&2
  exit 1
fi

# The CLI runs `python3 app.py` (cdk.json): the project's interpreter must come first.
export PATH="$PWD/.venv/bin:$PATH"
# Without these the CLI phones home (telemetry, version and notice checks); behind a
# network that accepts connections but never answers, it would hang forever.
export CDK_DISABLE_CLI_TELEMETRY=true
export CDK_DISABLE_VERSION_CHECK=1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
unset AWS_PROFILE

# A fresh cdk.out: a template left over from another environment must not linger.
rm -rf cdk.out
start=$(date +%s)
timeout "${SYNTH_TIMEOUT_SECONDS:-600}" \
  npx --no cdk synth -q --no-notices --output cdk.out "$@"
echo "synth: ok in $(($(date +%s) - start)) s -> cdk.out" >&2
