#!/usr/bin/env bash
# Create the virtual environment and install everything Starling needs.
# Safe to run again: every step is idempotent.
set -euo pipefail
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e ".[dev]"

# Redis is a Debian package, not a PyPI one.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing redis-server with apt-get"
    (apt-get install -y -q redis-server >/dev/null 2>&1) || \
      (apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null)
  else
    echo "setup: redis-server is missing; install it (e.g. 'sudo apt-get install redis-server')" >&2
    exit 1
  fi
fi
# Mosquitto is optional: interop tests and side-by-side benchmarks use it when present.
if ! command -v mosquitto >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -q mosquitto mosquitto-clients >/dev/null 2>&1 || \
    echo "setup: mosquitto not installed (optional)"
fi
# RabbitMQ is optional: the rules engine's RabbitMQ action tests start it (and skip without it).
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q rabbitmq-server >/dev/null 2>&1) || \
    (apt-get update -q >/dev/null && apt-get install -y -q rabbitmq-server >/dev/null 2>&1) || \
    echo "setup: rabbitmq-server not installed (optional)"
fi
# Headless Chromium is optional: the tenant report's rendering test opens the HTML in it
# (skipped, saying why, without it).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -q chromium >/dev/null 2>&1 || \
    (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null 2>&1) || \
    echo "setup: chromium not installed (optional)"
fi
echo "setup: ready"
