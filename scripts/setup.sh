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
# The exact versions CI tested (requirements.lock, written by scripts/lock.sh), then the
# project itself without resolving again.
"$VENV/bin/pip" install -q -r requirements.lock
"$VENV/bin/pip" install -q --no-deps -e ".[dev]"

as_root() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; }
apt_install() {  # apt_install PACKAGE...: quietly, refreshing the package lists once if needed
  apt-get install -y -q "$@" >/dev/null 2>&1 || \
    (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null 2>&1)
}
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }

# The analytics jobs (PySpark 4) need Java 17 or 21.
case "$(java_major 2>/dev/null)" in
  17|21) ;;
  *)
    if as_root; then
      echo "setup: installing a Java 17 runtime with apt-get (PySpark needs Java 17 or 21)"
      apt_install openjdk-17-jre-headless || apt_install openjdk-21-jre-headless || \
        echo "setup: no Debian JDK could be installed; the analytics jobs need Java 17 or 21" >&2
    else
      echo "setup: the analytics jobs need Java 17 or 21 on PATH" \
        "(e.g. 'sudo apt-get install openjdk-17-jre-headless'); the rest works without it" >&2
    fi
    ;;
esac

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
# HAProxy is optional: the load-balancer tests (PROXY protocol, the multi-host mesh) start it
# (and skip without it).
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ] && as_root; then
  apt_install haproxy || echo "setup: haproxy not installed (optional)"
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
