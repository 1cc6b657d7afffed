#!/usr/bin/env bash
# `make airflow`: Airflow, Ray and the MLflow UI run in a loopback-only namespace; their ports reach
# the host's 127.0.0.1 (the same port numbers) through Unix sockets (devstack/forward.py), so the
# browser on this machine opens the UI and the links tasks store (Ray dashboard, MLflow run/version).
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRFLOW_PORT=${AIRFLOW_PORT:-8080} RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265} MLFLOW_UI_PORT=${MLFLOW_UI_PORT:-5000}
dir="$PWD/.state/airflow-local/forward"
mkdir -p "$dir"
# binds the three ports on the host first (one line and exit 1 when one is taken), then detaches
forwarder=$(.venv/bin/python -m devstack.forward host "$dir" "$AIRFLOW_PORT" "$RAY_DASHBOARD_PORT" "$MLFLOW_UI_PORT" --background)
trap 'kill "$forwarder" 2>/dev/null || true' EXIT
EMR_RAY_FORWARD_DIR="$dir" bash scripts/loopback.sh .venv/bin/python -m scripts.airflow_local
