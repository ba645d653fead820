#!/usr/bin/env bash
# The tools that build and run the worker image without a Docker engine, installed
# only when missing: buildah, runc and debootstrap from Debian (as bootstrap.sh installs
# Java), then the local stand-in for the Dockerfile's base image, made once from
# Debian's packages and kept in ~/.cache/websocket-fleet/ (docs/DEPLOY.md, "Building
# the image"). Needs root, as apt-get and rootful buildah and runc do. Safe to run
# again: it does nothing when all is in place. scripts/bootstrap.sh --image-tools runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[image-tools] %s\n' "$*" >&2; }

missing=()
for tool in buildah runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${missing[*]}, and no apt-get to install them: install them by hand"; exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing ${missing[*]} with apt-get"
  started=$(date +%s)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq buildah runc debootstrap >/dev/null
  log "installed in $(($(date +%s) - started)) s"
fi

if [ ! -x .venv/bin/python ]; then
  log ".venv is missing: run scripts/bootstrap.sh first"; exit 1
fi
# The stand-in base: checked in well under a second, made in about a minute.
.venv/bin/python -m scripts.fleet_image base
