#!/usr/bin/env bash
# Install everything the project needs, from nothing, and only what is missing:
# Java 17 (for DynamoDB Local) and Node.js/npm from Debian when absent, the Python
# environment in .venv (pinned requirements) and the npm packages (package-lock.json).
# Safe to run again: it does nothing when all is in place.
# --image-tools: also the tools that build and run the worker image (scripts/image-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing $*, and no apt-get to install it: install it by hand"; exit 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing $* with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  log "Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)"; exit 1
fi
java -version >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
command -v npm >/dev/null 2>&1 || apt_install nodejs npm

stamp_ok() {  # stamp_ok STAMP_FILE FILES...: the files are unchanged since the stamp
  local stamp=$1; shift
  [ -f "$stamp" ] && [ "$(cat "$@" | sha256sum)" = "$(cat "$stamp")" ]
}
write_stamp() { local stamp=$1; shift; cat "$@" | sha256sum > "$stamp"; }

REQUIREMENTS=(requirements.txt requirements-dev.txt worker/requirements.txt)
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! stamp_ok .venv/.requirements.sha256 "${REQUIREMENTS[@]}"; then
  log "installing Python packages into .venv (pinned)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  write_stamp .venv/.requirements.sha256 "${REQUIREMENTS[@]}"
fi

if ! stamp_ok node_modules/.package-lock.sha256 package-lock.json; then
  log "installing npm packages (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
  write_stamp node_modules/.package-lock.sha256 package-lock.json
fi

# Optional: buildah, runc, debootstrap and the stand-in base image (test.sh and
# run-local.sh --containers ask for them).
if [ "${1:-}" = "--image-tools" ]; then
  bash scripts/image-tools.sh
fi
