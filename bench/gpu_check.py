"""GPU check: the shipped training job, run exactly as ``TorchTrainOperator`` runs it, with ``use_gpu=True``.

What it proves: that ``emr_ray.cluster.jobs.train`` (the job the operator submits) trains the shipped loop
``include.models.tabular:train_loop`` on a CUDA device end to end, with nothing patched: it stages a
committed Parquet partition with the project's own code (``include.data.synthetic``,
``emr_ray.cluster.partitions.write_tables``), starts a local Ray head with one GPU (``devstack.ray_head``), builds the
``TrainJobSpec`` the operator builds (``ScalingSpec(num_workers=1, use_gpu=True)``), and runs
``python -m emr_ray.cluster.jobs.train --spec ... --result-file ...`` against the head, as the Ray job's
entrypoint does. The best checkpoint's ``state.pt`` is then loaded with ``map_location=None``: the
loop saves the weights from the training device, so on a GPU run they come back on ``cuda:0``. It
checks the job succeeded, the weights' device, ``test_accuracy >= 0.85`` and the epoch count; writes
the facts (GPU name, final metrics, fit seconds, MLflow's per-epoch rows/s, wall time) to ``--out``
and exits 1 when a check fails (2 when ``use_gpu`` is asked for and torch sees no CUDA device).

Run from the repository root on a machine with one CUDA GPU (``emr_ray`` installed, or on
``PYTHONPATH`` as ``plugins``)::

    PYTHONPATH=plugins python -m bench.gpu_check --out bench/results/gpu_check.json

``--cpu`` runs the very same path with ``use_gpu=False`` (expected device ``cpu``), to test this
script without a GPU. On a shared machine run it inside the loopback-only namespace, where stopping
the head stops only this namespace's Ray (outside it, ``stop_head`` falls back to ``ray stop --force``)::

    bash scripts/loopback.sh .venv/bin/python -m bench.gpu_check --cpu --out /tmp/gpu_check_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from devstack import ray_head
from emr_ray.cluster import partitions, storage
from emr_ray.cluster import train as emr_train
from emr_ray.cluster.spec import (
    ERROR_MARKER,
    RESULT_MARKER,
    MLflowSection,
    ScalingSpec,
    TrainJobSpec,
    parse_marked,
)
from include.data.synthetic import FEATURE_COLUMNS, LABEL_COLUMN, make_partition

REPO = Path(__file__).resolve().parents[1]
PARTITION = "2026-11-05"
MIN_ACCURACY = 0.85
HYPERPARAMETERS = {"batch_size": 512, "lr": 0.003, "hidden": 64, "seed": 42}


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def stage_partition(root: Path, rows: int, test_rows: int) -> partitions.Committed:
    """A committed, standardised partition with ``train`` and ``test`` outputs (as preprocessing commits it)."""
    import pyarrow as pa

    final = f"file://{root}/tabular/dt={PARTITION}"
    table = make_partition(PARTITION, rows + test_rows)
    for column in FEATURE_COLUMNS:
        values = table[column].to_numpy()
        scaled = pa.array(((values - values.mean()) / values.std()).astype("float32"))
        table = table.set_column(table.schema.get_field_index(column), column, scaled)
    parts = {"train": table.slice(0, rows), "test": table.slice(rows)}
    return partitions.write_tables(final, parts, {"partition": PARTITION})


def build_spec(root: Path, partition: partitions.Committed, args: argparse.Namespace) -> TrainJobSpec:
    """The spec ``TorchTrainOperator.build_spec`` would build for this partition."""
    return TrainJobSpec(
        train_loop="include.models.tabular:train_loop",
        datasets={name: partition.output_uri(name) for name in ("train", "test")},
        run_name="gpu-check",
        storage_path=f"file://{root}/checkpoints/gpu-check",
        mlflow=MLflowSection(
            tracking_uri=f"sqlite:///{root}/mlflow.db",
            experiment_name="gpu-check",
            artifact_location=f"file://{root}/mlartifacts",
        ),
        config={"feature_columns": FEATURE_COLUMNS, "label_column": LABEL_COLUMN, "epochs": args.epochs}
        | HYPERPARAMETERS,
        scaling=ScalingSpec(num_workers=1, use_gpu=not args.cpu),
    )


def run_job(spec_file: Path, result_file: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """``python -m emr_ray.cluster.jobs.train`` (the job's entrypoint), its output streamed; (exit code, output)."""
    cmd = [
        sys.executable,
        "-m",
        "emr_ray.cluster.jobs.train",
        "--spec",
        spec_file,
        "--result-file",
        result_file,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            print(f"  | {line}", end="", flush=True)
            lines.append(line)
        return proc.wait(), "".join(lines)
    finally:
        timer.cancel()


def weight_devices(checkpoint_uri: str) -> list[str]:
    """The devices of the checkpointed model tensors, loaded where they were saved from."""
    import torch

    path = Path(storage.split_uri(checkpoint_uri)[1]) / emr_train.STATE_FILE
    state = torch.load(path, map_location=None)
    return sorted({str(tensor.device) for tensor in state["model"].values()})


def rows_per_second_by_epoch(result: dict[str, Any]) -> list[float]:
    """Training rows/s of each epoch, as the job logged them to MLflow."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=result["tracking_uri"])
    history = client.get_metric_history(result["mlflow_run_id"], "rows_per_second")
    return [round(m.value) for m in sorted(history, key=lambda m: m.step)]


def check(root: Path, state_dir: Path, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Stage, start the head, run the job, read its checkpoint back; fills ``out``."""
    import torch

    use_gpu = not args.cpu
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                    "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        out["gpu_name"] = torch.cuda.get_device_name(0)
    if use_gpu and not torch.cuda.is_available():
        out["error"] = "use_gpu=True but torch sees no CUDA device (run with --cpu to test without one)"
        return
    partition = stage_partition(root, args.rows, args.test_rows)
    spec = build_spec(root, partition, args)
    spec_file, result_file = root / "spec.json", root / "result.json"
    spec_file.write_text(spec.to_json())
    out["spec"] = spec.to_dict()
    log(
        f"staged {partition.partition_uri} ({partition.generation}); starting a Ray head ({args.num_cpus} CPUs, {int(use_gpu)} GPU) in {state_dir}"
    )

    started = time.monotonic()
    local = ray_head.start_head(state_dir, num_cpus=args.num_cpus, num_gpus=int(use_gpu))
    out["head_start_seconds"] = round(time.monotonic() - started, 2)
    env = os.environ | ray_head.cluster_env(state_dir) | {"RAY_ADDRESS": local.gcs_address}
    log(
        f"head up in {out['head_start_seconds']}s at {local.dashboard_url}; running emr_ray.cluster.jobs.train"
    )

    started = time.monotonic()
    code, output = run_job(spec_file, result_file, env, args.timeout)
    out["job_seconds"] = round(time.monotonic() - started, 2)
    out["job_exit_code"] = code
    marked = parse_marked(output, RESULT_MARKER)  # how the operator reads it; the file is the job's copy
    result = json.loads(result_file.read_text()) if result_file.exists() else marked
    if code or not result:
        out["error"] = parse_marked(output, ERROR_MARKER) or f"the job exited {code} without a result"
        out["job_output_tail"] = output[-4000:]
        return
    out["result"] = result
    out["final_metrics"] = result["final_metrics"]
    out["fit_seconds"] = result["fit_seconds"]
    out["rows_per_second_by_epoch"] = rows_per_second_by_epoch(result)
    out["weight_devices"] = weight_devices(result["checkpoint_uri"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_check.json"))
    parser.add_argument("--cpu", action="store_true", help="use_gpu=False: test this script without a GPU")
    parser.add_argument("--rows", type=int, default=20000, help="training rows")
    parser.add_argument("--test-rows", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=min(4, os.cpu_count() or 2))
    parser.add_argument("--timeout", type=float, default=600, help="seconds the job may run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (data, checkpoints, MLflow)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    expected = "cpu" if args.cpu else "cuda:0"
    out: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.orig_argv),
                           "use_gpu": not args.cpu, "expected_device": expected,
                           "ray": metadata.version("ray"), "python": sys.version.split()[0]}  # fmt: skip
    # Ray Train workers import include/ (and emr_ray, when it comes from PYTHONPATH) from here.
    inherited = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [str(REPO), *inherited]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    root = Path(tempfile.mkdtemp(prefix="gpu-check-")).resolve()
    state_dir = root / "ray"
    try:
        check(root, state_dir, args, out)
    except Exception as e:  # still stop the head and write what is known
        out["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if "head_start_seconds" in out:
            log("stopping the Ray head")
            ray_head.stop_head(state_dir)
        temp_link = ray_head.ray_temp_dir(state_dir)
        if not args.keep:
            if temp_link.is_symlink():
                temp_link.unlink()
            shutil.rmtree(root, ignore_errors=True)
        out["wall_seconds"] = round(time.monotonic() - started, 2)

    accuracy = out.get("final_metrics", {}).get("test_accuracy", 0.0)
    out["checks"] = {
        "job_succeeded": out.get("job_exit_code") == 0 and "result" in out,
        "weights_on_expected_device": out.get("weight_devices") == [expected],
        f"test_accuracy_ge_{MIN_ACCURACY}": accuracy >= MIN_ACCURACY,
        "epochs_completed": out.get("result", {}).get("epochs_completed") == args.epochs,
    }
    out["ok"] = all(out["checks"].values())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")
    log(f"{'OK' if out['ok'] else 'FAILED'}: {out['checks']}")
    log(f"device {out.get('weight_devices')} (expected {expected}), GPU {out.get('gpu_name', '-')}")
    log(f"test_accuracy {accuracy:.4f}, fit {out.get('fit_seconds')}s, rows/s by epoch "
        f"{out.get('rows_per_second_by_epoch')}, wall {out['wall_seconds']}s -> {args.out}")  # fmt: skip
    if "error" in out:
        log(f"error: {out['error']}")
    if not args.cpu and out.get("torch", {}).get("cuda_available") is False:
        return 2
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
