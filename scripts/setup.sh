#!/usr/bin/env bash
# Create .venv if missing and install the pinned stack (torch first: its CPU wheel), then this package.
# Re-runs only when a requirements/constraints/pyproject file changed (a stamp holds their hash).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
hash=$(cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
stamp="$VENV/.installed-$hash"
if [ -f "$stamp" ]; then exit 0; fi
echo "==> Installing the pinned stack into $VENV (first time: about 5 minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -U pip
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
# The HDFS provider's Kerberos extra (gssapi, krb5) has no Linux wheels: it compiles against libkrb5-dev.
if ! command -v krb5-config >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> Installing Debian's libkrb5-dev (to build gssapi/krb5 for the HDFS provider)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libkrb5-dev gcc) >/dev/null
  else
    echo "krb5-config not found: install libkrb5-dev (Debian) or krb5-devel (RHEL) and a C compiler, then rerun." >&2
    exit 1
  fi
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -c constraints.txt -r requirements-dev.txt
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e .
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> Installing Debian's chromium for the UI test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
      || echo "chromium could not be installed: the browser test will be skipped" >&2
  else
    echo "No chromium on PATH (install Debian's chromium package): the browser test will be skipped" >&2
  fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> Installing Debian's redis-server (the CeleryExecutor's broker: make airflow EXECUTOR=celery, the chaos soak)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
      || echo "redis-server could not be installed: the CeleryExecutor stack and its tests will be skipped" >&2
  else
    echo "No redis-server on PATH (install Debian's redis-server package): the CeleryExecutor stack is unavailable" >&2
  fi
fi
java -version >/dev/null 2>&1 || { echo "Java 17 is required for Spark (RayDP): install a JDK 17 and put java on PATH." >&2; exit 1; }
rm -f "$VENV"/.installed-*
touch "$stamp"
