#!/usr/bin/env bash
# `make airflow`: Airflow and Ray run in a loopback-only namespace; the UI port reaches the host's
# 127.0.0.1 through a Unix socket (devstack/forward.py), so the browser on this machine can use it.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${AIRFLOW_PORT:-8080}
mkdir -p .state/airflow-local
sock="$PWD/.state/airflow-local/ui.sock"
.venv/bin/python -m devstack.forward tcp-to-unix "$port" "$sock" &
forwarder=$!
trap 'kill $forwarder 2>/dev/null || true' EXIT
EMR_RAY_UI_SOCKET="$sock" bash scripts/loopback.sh .venv/bin/python -m scripts.airflow_local
