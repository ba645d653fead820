#!/usr/bin/env bash
# Set up from nothing, then run the whole system locally: DynamoDB Local, moto (SQS,
# CloudWatch), the demo feed and a few workers, with a live view. Ctrl-C stops it all.
# Options are passed on to `python -m local_stack` (see --help), except:
#   --containers          run the workers from the worker image (built first, as
#                         scripts/image.sh build does; with --handler-dir DIR built in)
#                         instead of the repository's code
#   --container-env NAME  with --containers: pass this variable of the environment into
#                         the workers' containers (your handler's own; repeatable)
set -euo pipefail
cd "$(dirname "$0")/.."

containers=0
handler_dir=""
pass_env=()
args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --containers) containers=1 ;;
    --container-env) pass_env+=(--pass-env "$2"); shift ;;
    --container-env=*) pass_env+=(--pass-env "${1#*=}") ;;
    --handler-dir) handler_dir="$2"; args+=("$1" "$2"); shift ;;
    --handler-dir=*) handler_dir="${1#*=}"; args+=("$1") ;;
    *) args+=("$1") ;;
  esac
  shift
done

if [ "$containers" -eq 0 ]; then
  bash scripts/bootstrap.sh
  exec .venv/bin/python -m local_stack "${args[@]}"
fi

bash scripts/bootstrap.sh --image-tools
build=(build)
[ -z "$handler_dir" ] || build+=(--handler-dir "$handler_dir")
.venv/bin/python -m scripts.fleet_image "${build[@]}" >/dev/null
# The local stack starts each worker as `<shim> -m worker`: the shim runs it in a
# container of the image (scripts/fleet_image, worker-shim).
shim="${WSFLEET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/websocket-fleet}/worker-shim"
mkdir -p "$(dirname "$shim")"
{
  echo '#!/bin/sh'
  printf 'exec %q -m scripts.fleet_image worker-shim' "$PWD/.venv/bin/python"
  [ "${#pass_env[@]}" -eq 0 ] || printf ' %q' "${pass_env[@]}"
  echo ' -- "$@"'
} > "$shim"
chmod +x "$shim"
# Ctrl-C reaches the local stack, which stops the workers in order; this script stays
# to remove what a killed worker may have left.
trap 'true' INT TERM
status=0
LOCAL_STACK_WORKER_PYTHON="$shim" .venv/bin/python -m local_stack "${args[@]}" || status=$?
.venv/bin/python -m scripts.fleet_image cleanup
exit "$status"
