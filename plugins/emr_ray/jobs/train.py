"""Job: distributed PyTorch training with Ray Train's TorchTrainer, tracked in MLflow.

Workers read their own shards of the committed Parquet partitions (``emr_ray.jobs.shards``); the
job only plans them from the Parquet footers, so no data passes through the job or Ray's object store.

Identity makes it resumable: the run's storage path and name come from the Airflow task, and a
small state file there remembers the MLflow run and (once done) the result. A retry of an
unfinished run resumes from its latest checkpoint into the same MLflow run; a rerun of a finished
run with the same inputs returns the stored result instead of training again; a rerun with other
inputs or hyperparameters starts clean.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any

from emr_ray import storage
from emr_ray.jobs import shards
from emr_ray.jobs._runtime import JobInputError, main, storage_options
from emr_ray.spec import import_by_path

log = logging.getLogger("emr_ray.jobs.train")
STATE_FILE = "_emr_ray_state.json"


def fingerprint(spec: dict[str, Any], manifests: dict[str, Any]) -> str:
    """What makes two trainings the same: code path, config, scaling and the exact input data."""
    keys = ("train_loop", "config", "scaling", "datasets")
    payload = {k: spec.get(k) for k in keys} | {"manifests": manifests}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_state(fsys, path: str) -> dict[str, Any]:
    from pyarrow import fs as pafs

    if fsys.get_file_info(f"{path}/{STATE_FILE}").type != pafs.FileType.File:
        return {}
    with fsys.open_input_stream(f"{path}/{STATE_FILE}") as f:
        return json.loads(f.read().decode())


def _write_state(fsys, path: str, state: dict[str, Any]) -> None:
    fsys.create_dir(path, recursive=True)
    with fsys.open_output_stream(f"{path}/{STATE_FILE}") as f:
        f.write(json.dumps(state, indent=2, sort_keys=True, default=str).encode())


def _plan_datasets(spec: dict[str, Any], options: storage.StorageOptions) -> dict[str, Any]:
    """The shard plan for the workers: each dataset's Parquet files with their row counts."""
    datasets = {}
    for name, uri in spec["datasets"].items():
        files = storage.list_parquet_files(uri, options)
        if not files:
            raise JobInputError(
                f"Training input {name}={uri} has no Parquet files; run the preprocessing step first."
            )
        counted = storage.parquet_row_counts(files, uri, options)
        if not sum(rows for _, rows in counted):
            raise JobInputError(f"Training input {name}={uri} has no rows; check the preprocessing step.")
        datasets[name] = shards.describe(uri, counted, equal=(name == "train"))
    return {"datasets": datasets, "storage": spec.get("storage") or {}}


def _mlflow_callback(tracking_uri: str, mlflow_run_id: str, epochs: int):
    """A Ray Train callback (it runs in the controller) that logs each epoch to the log and to MLflow."""
    from ray.train import UserCallback

    class EpochLogger(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            import mlflow

            first = dict(metrics[0])
            epoch = int(first.pop("epoch", 0))
            text = " ".join(
                f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(first.items())
            )
            print(f"[emr_ray] epoch {epoch + 1}/{epochs} {text}", flush=True)
            numeric = {k: float(v) for k, v in first.items() if isinstance(v, (int, float))}
            mlflow.MlflowClient(tracking_uri=tracking_uri).log_batch(
                mlflow_run_id,
                metrics=[
                    mlflow.entities.Metric(k, v, int(time.time() * 1000), epoch) for k, v in numeric.items()
                ],
            )

    return EpochLogger()


def _start_mlflow_run(spec: dict[str, Any], state: dict[str, Any]) -> str:
    import mlflow

    settings = spec["mlflow"]
    client = mlflow.MlflowClient(
        tracking_uri=settings["tracking_uri"], registry_uri=settings.get("registry_uri")
    )
    if state.get("mlflow_run_id"):
        run_id = state["mlflow_run_id"]
        client.update_run(run_id, status="RUNNING")
        log.info("Resuming MLflow run %s", run_id)
        return run_id
    name = settings["experiment_name"]
    experiment = client.get_experiment_by_name(name)
    if experiment:
        experiment_id = experiment.experiment_id
    else:
        experiment_id = client.create_experiment(name, artifact_location=settings.get("artifact_location"))
    tags = {**settings.get("tags", {}), "emr_ray.run_name": spec["run_name"]}
    run = client.create_run(experiment_id, run_name=spec["run_name"], tags=tags)
    params = {k: v for k, v in spec["config"].items() if not isinstance(v, (list, dict))}
    params |= {f"scaling.{k}": v for k, v in spec["scaling"].items()}
    params |= {f"data.{k}": v for k, v in spec["datasets"].items()}
    for key, value in params.items():
        client.log_param(run.info.run_id, key, str(value)[:6000])
    return run.info.run_id


def _backfill_checkpoint_metrics(fsys, run_path: str, tracking_uri: str, mlflow_run_id: str) -> None:
    """Log the epochs a stopped attempt checkpointed but had no time to send to MLflow."""
    import mlflow
    from pyarrow import fs as pafs

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    logged = {m.step for m in client.get_metric_history(mlflow_run_id, "test_loss")}
    infos = fsys.get_file_info(pafs.FileSelector(run_path, allow_not_found=True))
    for info in sorted(
        i.path for i in infos if i.type == pafs.FileType.Directory and "/checkpoint_" in i.path
    ):
        if fsys.get_file_info(f"{info}/metrics.json").type != pafs.FileType.File:
            continue
        with fsys.open_input_stream(f"{info}/metrics.json") as f:
            metrics = json.loads(f.read().decode())
        epoch = int(metrics.pop("epoch", -1))
        if epoch >= 0 and epoch not in logged:
            stamp = int(time.time() * 1000)
            numeric = [mlflow.entities.Metric(k, float(v), stamp, epoch) for k, v in metrics.items()
                       if isinstance(v, (int, float))]  # fmt: skip
            client.log_batch(mlflow_run_id, metrics=numeric)
            log.info("Backfilled MLflow metrics of checkpointed epoch %d", epoch)


def _log_model(spec: dict[str, Any], mlflow_run_id: str, checkpoint, example) -> None:
    """Rebuild the model from the best checkpoint and log it (with signature and input example)."""
    import mlflow
    import torch

    module = spec["train_loop"].partition(":")[0]
    build = import_by_path(spec.get("model_factory") or f"{module}:build_model")
    load = import_by_path(spec.get("load_weights") or f"{module}:load_weights")
    model = build(spec["config"])
    with checkpoint.as_directory() as ckpt_dir:
        load(model, ckpt_dir)
    model.eval()
    mlflow.set_tracking_uri(spec["mlflow"]["tracking_uri"])
    code_dir = os.path.dirname(os.path.dirname(os.path.abspath(import_by_path(f"{module}:__file__"))))
    with mlflow.start_run(run_id=mlflow_run_id):
        mlflow.pytorch.log_model(
            model,
            name="model",
            input_example=example,
            code_paths=[code_dir] if os.path.basename(code_dir) == "include" else None,
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
        )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    options = storage_options(spec)
    train_loop = import_by_path(spec["train_loop"])
    manifests = {}
    for name, uri in spec["datasets"].items():
        partition_root = uri.rstrip("/").rpartition("/")[0]
        manifests[name] = (
            storage.read_manifest(partition_root, options).get("outputs", {}).get(name, {}).get("rows")
        )
    print_key = fingerprint(spec, manifests)
    fsys, run_path = storage.resolve(storage.join(spec["storage_path"], spec["run_name"]), options)
    state = _read_state(fsys, run_path)
    if state.get("fingerprint") == print_key and state.get("result"):
        log.info(
            "Training %s already finished with these inputs; returning its stored result.", spec["run_name"]
        )
        return state["result"] | {"reused": True}
    if state and state.get("fingerprint") != print_key:
        log.info("Inputs changed since the stored run %s: starting it clean.", spec["run_name"])
        fsys.delete_dir(run_path)
        state = {}

    # Ray Train's controller polls its workers every 2 s by default: each epoch's report, and the end
    # of training, wait for the next poll. Polls are cheap; 0.5 s takes seconds off every fit().
    # Ray Train passes this variable from the driver to its controller and workers.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    ray.init(address="auto", logging_level=logging.WARNING)
    started = time.monotonic()
    plan = _plan_datasets(spec, options)
    rows = {name: sum(n for _, n in entry["files"]) for name, entry in plan["datasets"].items()}
    workers = int(spec["scaling"].get("num_workers", 2))
    if rows["train"] < workers:
        raise JobInputError(
            f"Training input {spec['datasets']['train']} has {rows['train']} rows for {workers} workers; "
            "use fewer workers or a larger partition."
        )
    log.info("Planned per-worker shards of %s rows in %.1fs", rows, time.monotonic() - started)
    resuming = bool(state.get("mlflow_run_id"))
    state = {"fingerprint": print_key, "mlflow_run_id": _start_mlflow_run(spec, state)}
    _write_state(fsys, run_path, state)
    mlflow_run_id = state["mlflow_run_id"]
    if resuming:
        _backfill_checkpoint_metrics(fsys, run_path, spec["mlflow"]["tracking_uri"], mlflow_run_id)

    scaling, ckpt, failure = spec["scaling"], spec.get("checkpoint", {}), spec.get("failure", {})
    epochs = int(spec["config"].get("epochs", 5))
    storage_scheme, storage_root = storage.split_uri(spec["storage_path"])
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={**spec["config"], shards.PLAN_KEY: plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=int(scaling.get("num_workers", 2)),
            use_gpu=bool(scaling.get("use_gpu", False)),
            resources_per_worker=scaling.get("resources_per_worker"),
            placement_strategy=scaling.get("placement_strategy", "PACK"),
        ),
        run_config=ray.train.RunConfig(
            name=spec["run_name"],
            storage_path=storage_root,
            storage_filesystem=storage.filesystem(spec["storage_path"], options)
            if storage_scheme != "file"
            else None,
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=ckpt.get("num_to_keep", 2),
                checkpoint_score_attribute=ckpt.get("score_attribute", "test_loss"),
                checkpoint_score_order=ckpt.get("score_order", "min"),
            ),
            failure_config=ray.train.FailureConfig(max_failures=int(failure.get("max_failures", 1))),
            callbacks=[_mlflow_callback(spec["mlflow"]["tracking_uri"], mlflow_run_id, epochs)],
        ),
    )
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=spec["mlflow"]["tracking_uri"])
    try:
        fit_started = time.monotonic()
        result = trainer.fit()
        fit_seconds = time.monotonic() - fit_started
        if result.error:
            raise result.error
        best = result.get_best_checkpoint(
            ckpt.get("score_attribute", "test_loss"), ckpt.get("score_order", "min")
        )
        best = best or result.checkpoint
        if best is None:
            raise RuntimeError(f"Training {spec['run_name']} finished without a checkpoint; nothing to log.")
        example_set = plan["datasets"]["test" if "test" in plan["datasets"] else "train"]
        example = _input_example(example_set, spec["config"], options)
        _log_model(spec, mlflow_run_id, best, example)
        _log_loss_curve(client, mlflow_run_id, spec["run_name"])
        final = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
        for key in ("test_accuracy", "test_loss"):
            if key in final:
                client.log_metric(mlflow_run_id, f"final_{key}", float(final[key]))
        client.log_metric(mlflow_run_id, "fit_seconds", fit_seconds)
        client.set_terminated(mlflow_run_id, status="FINISHED")
    except BaseException:
        client.set_terminated(mlflow_run_id, status="FAILED")
        raise
    best_metrics = {}
    for checkpoint, metrics in result.best_checkpoints or []:
        if checkpoint.path == best.path:
            best_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    prefix = "file://" if storage_scheme == "file" else f"{storage_scheme}://"
    output = {
        "mlflow_run_id": mlflow_run_id,
        "tracking_uri": spec["mlflow"]["tracking_uri"],
        "run_name": spec["run_name"],
        "checkpoint_uri": prefix + best.path.lstrip("/") if storage_scheme != "file" else prefix + best.path,
        "final_metrics": final,
        "best_metrics": best_metrics,
        "epochs_completed": int(final.get("epoch", epochs - 1)) + 1,
        "rows": rows,
        "fit_seconds": round(fit_seconds, 2),
    }
    _write_state(fsys, run_path, state | {"result": output})
    return output


def _input_example(entry: dict[str, Any], config: dict[str, Any], options: storage.StorageOptions):
    """Three rows of features, for the logged model's signature and input example."""
    import numpy as np

    columns = list(config["feature_columns"])
    pieces = [shards.Piece(entry["files"][0][0], 0, min(3, int(entry["files"][0][1])))]
    table = shards.read(pieces, storage.filesystem(entry["uri"], options), columns)
    return np.column_stack([table.column(c).to_numpy() for c in columns]).astype(np.float32)


def _log_loss_curve(client, mlflow_run_id: str, title: str) -> None:
    """Plot the per-epoch losses (and accuracy) from MLflow's history into ``loss_curve.png``."""
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run_id, key))
        for key in ("train_loss", "test_loss", "test_accuracy")
    }
    if not history["train_loss"]:
        return
    figure, (losses, accuracy) = plt.subplots(1, 2, figsize=(9, 3.5))
    for key in ("train_loss", "test_loss"):
        losses.plot([s + 1 for s, _ in history[key]], [v for _, v in history[key]], marker="o", label=key)
    losses.set(xlabel="epoch", ylabel="loss", title="loss")
    losses.legend()
    points = history["test_accuracy"]
    accuracy.plot([s + 1 for s, _ in points], [v for _, v in points], marker="o", color="tab:green")
    accuracy.set(xlabel="epoch", ylabel="accuracy", title="test accuracy")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "loss_curve.png")
        figure.savefig(path, dpi=100)
        client.log_artifact(mlflow_run_id, path)
    plt.close(figure)


if __name__ == "__main__":
    main(run)
