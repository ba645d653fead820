#!/usr/bin/env bash
# The worker image without a Docker engine (docs/DEPLOY.md, "Building the image"):
#   scripts/image.sh build [--handler-dir DIR]      build it from worker/Dockerfile over
#                                                   the staged context (cached layers)
#   scripts/image.sh run [--template T] [--duration S] [--set NAME=VALUE]
#                                                   run it as the template's task definition
#                                                   says, against a local stack
#   scripts/image.sh lint | lock | check-lock | pin-base | base | cleanup
# Sets up what it needs first (scripts/bootstrap.sh --image-tools). Paths are taken
# relative to where it is called from.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
case "${1:-}" in
  lint|lock|check-lock|pin-base|-h|--help|"") bash "$ROOT/scripts/bootstrap.sh" ;;
  *) bash "$ROOT/scripts/bootstrap.sh" --image-tools ;;
esac
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" -m scripts.fleet_image "$@"
