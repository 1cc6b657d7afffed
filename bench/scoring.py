"""Benchmark: batch scoring in the Airflow worker (the scoring DAG before ``RayBatchPredictOperator``)
against scoring on the cluster with Ray Data, side by side on the same committed partition.

Contenders, each in a fresh process so that its peak RSS is its own:

* ``worker``: ``include.scoring.tabular.score_partition``, the task body the scoring DAG ran: every
  row of the partition read into the process, predicted, written and committed.
* ``cluster``: ``emr_ray.cluster.jobs.predict.run``, the job ``RayBatchPredictOperator`` submits, as its
  driver runs it: Ray Data streams the rows through ``--workers`` model replicas and writes them; the
  driver holds no row. The Airflow worker of that operator only submits and polls: what it holds does
  not depend on the rows at all; the driver's peak RSS is the upper bound reported for it.

Same data for both (``--rows`` sizes x 16 float32 features + label, committed as one generation of a
``file://`` partition under ``.state/bench/scoring``) and the same model (a registered tabular MLP in
a local MLflow store). Reported per size: rows/s (wall time of the whole scoring, start-up included,
and apart), peak RSS, and the ratios. One local Ray node (``--cpus``); a second node's scaling is
not measured here yet.

    bash scripts/loopback.sh .venv/bin/python -m bench.scoring --rows 200000,1000000
    bash scripts/loopback.sh .venv/bin/python -m bench.scoring --rows 10000000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench._common import REPO, STATE, machine, table, write_dataset, write_json

ROOT = STATE / "scoring"
MODEL = "bench-tabular-mlp"


def committed_partition(rows: int) -> str:
    """The bench's rows as the ``test`` output of one committed generation; its output URI."""
    from emr_ray.cluster import partitions, storage

    files = write_dataset(rows, f"scoring-{rows}")
    partition = f"file://{ROOT}/staged-{rows}/tabular/dt=2026-11-05"
    if (current := partitions.current(partition)) is not None:
        return current.output_uri("test")
    generation = partitions.new_generation()
    folder = Path(storage.split_uri(partitions.output_uri(partition, generation, "test"))[1])
    folder.mkdir(parents=True)
    for path in files:
        shutil.copyfile(path, folder / Path(path).name)
    return partitions.commit(partition, generation, {"outputs": {"test": {"rows": rows}}}).output_uri("test")


def registered_model() -> tuple[str, str]:
    """A tabular MLP (untrained: scoring costs the same) registered in a local store; (URI, version)."""
    import mlflow
    import mlflow.pytorch
    import numpy as np
    import torch

    from include.models.tabular import build_model

    uri = f"sqlite:///{ROOT}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    if client.search_registered_models(f"name = '{MODEL}'"):
        return uri, "1"
    torch.manual_seed(0)
    model = build_model({"feature_columns": [f"f{i:02d}" for i in range(16)], "hidden": 64})
    mlflow.set_tracking_uri(uri)
    experiment = client.create_experiment("bench-scoring", artifact_location=(ROOT / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = mlflow.pytorch.log_model(model.eval(), name="model", input_example=np.zeros((2, 16), np.float32),
                                          pip_requirements=["torch"])  # fmt: skip
    mlflow.register_model(logged.model_uri, MODEL)
    mlflow.set_tracking_uri("")
    return uri, "1"


#: this process's peak RSS since its exec (VmHWM; ru_maxrss would carry the parent's across the exec)
PEAK = """
def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
"""

WORKER = (
    PEAK
    + """
import json, sys, time
started = time.perf_counter()
import mlflow.pyfunc
from include.scoring.tabular import score_partition
tracking, version, staging = sys.argv[1:4]
mlflow.set_tracking_uri(tracking)
model = mlflow.pyfunc.load_model(f"models:/{sys.argv[4]}/{version}")
ready = time.perf_counter()
out = score_partition(staging, "2026-11-05", model, model_name=sys.argv[4], version=version)
done = time.perf_counter()
print(json.dumps({"rows": out["rows"], "seconds": done - started, "startup_seconds": ready - started,
                  "peak_rss_mb": peak_rss_mb()}))
"""
)

CLUSTER = (
    PEAK
    + """
import json, sys, time
started = time.perf_counter()
from bench._common import init_ray, setup_env
setup_env()
init_ray(num_cpus=int(sys.argv[6]))
from emr_ray.cluster.jobs import predict
from emr_ray.cluster.spec import MLflowSection, PredictJobSpec
tracking, version, input_uri, output_uri, model = sys.argv[1:6]
spec = PredictJobSpec(partition="2026-11-05", input_uri=input_uri, output_uri=output_uri, model_name=model,
                      model_version=version, mlflow=MLflowSection(tracking_uri=tracking, experiment_name="bench-scoring"),
                      config={"label_column": "label"}, num_workers=int(sys.argv[7]), batch_size=8192)
ready = time.perf_counter()
out = predict.run(spec)
done = time.perf_counter()
print(json.dumps({"rows": out.rows, "seconds": done - started, "startup_seconds": ready - started,
                  "peak_rss_mb": peak_rss_mb()}))
"""
)


def run(script: str, *args: str) -> dict[str, Any]:
    """``script`` in a fresh Python on this tree's code (``plugins/`` ahead of any installed copy)."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="200000,1000000", help="comma-separated partition sizes")
    parser.add_argument("--workers", type=int, default=1, help="model replicas on the cluster")
    parser.add_argument("--cpus", type=int, default=2, help="the local Ray node's CPUs")
    args = parser.parse_args(argv)
    ROOT.mkdir(parents=True, exist_ok=True)
    tracking, version = registered_model()
    results: dict[str, Any] = {"machine": machine(), "workers": args.workers, "sizes": {}}
    rows_out = []
    for rows in [int(r) for r in args.rows.split(",") if r]:
        input_uri = committed_partition(rows)
        staging = input_uri.split("/tabular/")[0]
        worker = run(WORKER, tracking, version, staging, MODEL)
        cluster = run(CLUSTER, tracking, version, input_uri, f"file://{ROOT}/cluster-{rows}/predictions/dt=2026-11-05",
                      MODEL, str(args.cpus), str(args.workers))  # fmt: skip
        results["sizes"][rows] = {"worker": worker, "cluster": cluster}
        for name, got in (("in the Airflow worker", worker), ("on the cluster (Ray Data)", cluster)):
            scoring = got["seconds"] - got["startup_seconds"]
            rows_out.append([f"{rows:,}", name, f"{rows / got['seconds']:,.0f}", f"{rows / scoring:,.0f}",
                             f"{got['startup_seconds']:.1f}", f"{got['peak_rss_mb']:,.0f}"])  # fmt: skip
        rows_out.append(["", "ratio cluster / worker", f"{worker['seconds'] / cluster['seconds']:.2f}x", "", "",
                         f"{cluster['peak_rss_mb'] / worker['peak_rss_mb']:.2f}x"])  # fmt: skip
    print(
        table(
            ["rows", "contender", "rows/s (whole)", "rows/s (scoring)", "start-up s", "peak RSS MB"], rows_out
        )
    )
    print(f"results: {write_json('scoring.json', results)}")


if __name__ == "__main__":
    main()
