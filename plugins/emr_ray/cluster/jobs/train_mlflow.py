"""The training job's MLflow side: the run, per-epoch metrics, the model and its loss curve.

Runs on the cluster, in the job's driver and (for the epoch callback) in Ray Train's controller.

Credentials: MLflow reads ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` (or ``TOKEN``) from the
environment at each request. The job's secret channel (:mod:`emr_ray.cluster.secrets`) puts them there: the
driver takes them at start, and every other process calls :func:`ensure_credentials` before it
builds a client (:func:`client` does). A refusal (401, 403) when the run starts ends the job as an
input error (exit 2: a retry cannot fix a login), with a message that says what the job had.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

from emr_ray.cluster import mlflow_auth, secrets
from emr_ray.cluster import train as emr_train
from emr_ray.cluster.jobs import train_checkpoints, train_datasets
from emr_ray.cluster.jobs._runtime import JobInputError
from emr_ray.cluster.jobs.train_datasets import RunInput
from emr_ray.cluster.results import TrainResult
from emr_ray.cluster.spec import MLflowSection, TrainJobSpec, import_by_path

log = logging.getLogger("emr_ray.cluster.jobs.train")


class LogsToMLflow(Protocol):
    """A job spec with an ``mlflow`` part: all :func:`client` and :func:`refused_as_input_error` read,
    so the RLlib job (:class:`~emr_ray.cluster.spec.RLlibJobSpec`) uses them as the training job does."""

    @property
    def mlflow(self) -> MLflowSection: ...


def ensure_credentials() -> None:
    """Make the job's MLflow credentials visible to MLflow in this process (any process of the job:
    the driver, Ray Train's controller, a worker). A no-op where there are none or they are set."""
    secrets.ensure_env()


def client(spec: LogsToMLflow):
    import mlflow

    ensure_credentials()
    return mlflow.MlflowClient(tracking_uri=spec.mlflow.tracking_uri, registry_uri=spec.mlflow.registry_uri)


@contextmanager
def refused_as_input_error(spec: LogsToMLflow) -> Iterator[None]:
    """Turn MLflow refusing the job's credentials (401, 403) into a :class:`JobInputError` that says
    what the job had (never the secret) and what to fix on the Airflow side."""
    try:
        yield
    except Exception as e:
        status = mlflow_auth.refusal(e)
        if status is None:
            raise
        had = mlflow_auth.present()
        fix = (
            "grant that user EDIT on the experiment (or use another login)"
            if status == 403
            else "set login and password (or a token) on the training task's mlflow connection"
            if had == "no credentials"
            else "fix the login and password (or the token) on the training task's mlflow connection"
        )
        raise JobInputError(
            f"MLflow at {mlflow_auth.redact_uri(spec.mlflow.tracking_uri)} refused the training job ({status}) with {had}: {fix}. "
            "A retry cannot fix this."
        ) from e


def start_run(spec: TrainJobSpec, resume_run_id: str | None, run_inputs: Sequence[RunInput] = ()) -> str:
    """The MLflow run of this training: the stored one when resuming, else a new one with the params;
    with its input datasets (:mod:`emr_ray.cluster.jobs.train_datasets`)."""
    with refused_as_input_error(spec):
        run_id = _start_run(spec, resume_run_id)
        train_datasets.log_inputs(client(spec), run_id, list(run_inputs))
        return run_id


def _start_run(spec: TrainJobSpec, resume_run_id: str | None) -> str:
    mlflow_client = client(spec)
    if resume_run_id:
        mlflow_client.update_run(resume_run_id, status="RUNNING")
        log.info("Resuming MLflow run %s", resume_run_id)
        return resume_run_id
    settings = spec.mlflow
    experiment = mlflow_client.get_experiment_by_name(settings.experiment_name)
    if experiment:
        experiment_id = experiment.experiment_id
    else:
        experiment_id = mlflow_client.create_experiment(
            settings.experiment_name, artifact_location=settings.artifact_location
        )
    from mlflow.entities import Param

    from emr_ray.cluster.reuse import record_value

    tags = {**settings.tags, "emr_ray.run_name": spec.run_name}
    run = mlflow_client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
    params = {k: v for k, v in spec.config.items() if not isinstance(v, (list, dict))}
    params |= {f"scaling.{k}": v for k, v in spec.scaling.to_dict().items()}
    params |= {f"data.{k}": v for k, v in spec.datasets.items()}
    # one request (MLflow takes up to 100 params per batch)
    # a config value named like a secret never becomes a param (anyone who may read the run sees it)
    batch = [Param(key, record_value(key, value)) for key, value in params.items()]
    for start in range(0, len(batch), 100):
        mlflow_client.log_batch(run.info.run_id, params=batch[start : start + 100])
    return run.info.run_id


def begin_run(
    spec: TrainJobSpec, options: Any, resume_run_id: str | None, run_inputs: Sequence[RunInput] = ()
) -> str:
    """:func:`start_run`, and when resuming, :func:`backfill_checkpointed_epochs` from the run's folder
    (read with ``options``): the run's first step, as one call to a warm group's rank 0."""
    from emr_ray.cluster import storage

    if spec.compare is not None:  # a process for the champion, importing while the epochs run
        from emr_ray.cluster.jobs import clean_process

        clean_process.prepare()
    run_id = start_run(spec, resume_run_id, run_inputs)
    if resume_run_id:
        fsys, path = storage.resolve(spec.run_uri, options)
        backfill_checkpointed_epochs(fsys, path, spec, run_id)
    return run_id


def end_run(spec: TrainJobSpec, mlflow_run_id: str, final: dict[str, Any], fit_seconds: float) -> None:
    """The run's last step: the final epoch's test metrics and the fit's seconds, then FINISHED."""
    import mlflow

    stamp = int(time.time() * 1000)
    values = {f"final_{key}": float(final[key]) for key in ("test_accuracy", "test_loss") if key in final}
    values["fit_seconds"] = float(fit_seconds)
    mlflow_client = client(spec)
    mlflow_client.log_batch(
        mlflow_run_id, metrics=[mlflow.entities.Metric(k, v, stamp, 0) for k, v in values.items()]
    )
    mlflow_client.set_terminated(mlflow_run_id, status="FINISHED")


def log_usage(spec: TrainJobSpec, result: TrainResult) -> None:
    """Log what the job used as ``usage.*`` metrics on the MLflow run it trained (not on a reused run:
    that run has the figures of the job that trained it). From the job, whose MLflow client is up:
    the Airflow side then needs no MLflow import for it."""
    log_usage_as(spec, result, None)


def log_usage_as(spec: TrainJobSpec, result: TrainResult, credentials: dict[str, str] | None) -> None:
    """:func:`log_usage` with ``credentials`` (:func:`emr_ray.cluster.mlflow_auth.credentials`) passed to this
    request only, never through ``os.environ``: on a warm group's rank 0 after the job's lease, where
    another job's loop may run meanwhile and must not see them (None: the process's own, as the
    driver has them)."""
    import mlflow

    from emr_ray.cluster.jobs._usage import mlflow_metrics

    run_id, metrics = result.mlflow_run_id, mlflow_metrics(result.usage)
    if not metrics or result.reused:
        return
    stamp = int(time.time() * 1000)
    batch = [mlflow.entities.Metric(key, value, stamp, 0) for key, value in sorted(metrics.items())]
    if credentials is None:
        client(spec).log_batch(run_id, metrics=batch)
    elif urlsplit(spec.mlflow.tracking_uri).scheme not in ("http", "https"):  # a database or files: no login
        mlflow.MlflowClient(tracking_uri=spec.mlflow.tracking_uri).log_batch(run_id, metrics=batch)
    else:
        _rest_store_as(spec.mlflow.tracking_uri, credentials).log_batch(run_id, batch, [], [])


def _rest_store_as(tracking_uri: str, credentials: dict[str, str]):
    """MLflow's REST store for ``tracking_uri`` whose requests carry ``credentials`` (it reads its login
    per request from the function it is given; MLflow's default function reads the environment)."""
    from mlflow.environment_variables import (
        MLFLOW_TRACKING_CLIENT_CERT_PATH,
        MLFLOW_TRACKING_SERVER_CERT_PATH,
    )
    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.utils.rest_utils import MlflowHostCreds

    insecure = credentials.get(mlflow_auth.INSECURE_TLS, "").lower() in ("true", "1")
    creds = MlflowHostCreds(
        tracking_uri,
        username=credentials.get(mlflow_auth.USERNAME),
        password=credentials.get(mlflow_auth.PASSWORD),
        token=credentials.get(mlflow_auth.TOKEN),
        ignore_tls_verification=insecure,
        client_cert_path=MLFLOW_TRACKING_CLIENT_CERT_PATH.get(),
        server_cert_path=None if insecure else MLFLOW_TRACKING_SERVER_CERT_PATH.get(),
    )
    return RestStore(lambda: creds)


def epoch_callback(tracking_uri: str, mlflow_run_id: str, epochs: int):
    """A Ray Train callback (it runs in the controller) that logs each epoch to the log and to MLflow."""
    from ray.train import UserCallback

    class EpochLogger(UserCallback):
        secrets: secrets.CopyName | None = None

        def after_report(self, run_context, metrics, checkpoint):
            log_epoch(tracking_uri, mlflow_run_id, epochs, metrics[0])

    logger = EpochLogger()
    logger.secrets = secrets.carried()  # pickled to the controller with it: where the secrets are
    return logger


def log_epoch(tracking_uri: str, mlflow_run_id: str, epochs: int, metrics: dict[str, Any]) -> None:
    """Print one epoch's metrics (the task log's progress) and log them to the MLflow run, where the
    reports arrive: Ray Train's controller actor (a warm group's job prints them and its rank 0 logs
    them: :func:`print_epoch`, :func:`log_epoch_metrics`)."""
    ensure_credentials()  # in Ray Train's controller actor, not in the driver
    print_epoch(epochs, metrics)
    log_epoch_metrics(tracking_uri, mlflow_run_id, metrics)


def print_epoch(epochs: int, metrics: dict[str, Any]) -> None:
    """``[emr_ray] epoch 3/5 test_loss=0.4123 ...``: one line per epoch in the job's (and task's) log."""
    first = dict(metrics)
    epoch = int(first.pop("epoch", 0))
    text = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(first.items()))
    print(f"[emr_ray] epoch {epoch + 1}/{epochs} {text}", flush=True)


def log_epoch_metrics(tracking_uri: str, mlflow_run_id: str, metrics: dict[str, Any]) -> None:
    """One epoch's numeric metrics on the MLflow run, at the epoch's step."""
    import mlflow

    first = dict(metrics)
    epoch = int(first.pop("epoch", 0))
    numeric = {k: float(v) for k, v in first.items() if isinstance(v, (int, float))}
    mlflow.MlflowClient(tracking_uri=tracking_uri).log_batch(
        mlflow_run_id,
        metrics=[mlflow.entities.Metric(k, v, int(time.time() * 1000), epoch) for k, v in numeric.items()],
    )


def backfill_checkpointed_epochs(fsys, run_path: str, spec: TrainJobSpec, mlflow_run_id: str) -> None:
    """Log the epochs a stopped attempt checkpointed but had no time to send to MLflow.

    The metrics come from the checkpoints themselves, read through :mod:`emr_ray.cluster.train`.
    """
    import mlflow
    from pyarrow import fs as pafs

    mlflow_client = client(spec)
    logged = {m.step for m in mlflow_client.get_metric_history(mlflow_run_id, "test_loss")}
    infos = fsys.get_file_info(pafs.FileSelector(run_path, allow_not_found=True))
    for directory in sorted(
        i.path for i in infos if i.type == pafs.FileType.Directory and "/checkpoint_" in i.path
    ):
        metrics = train_checkpoints.read_json(fsys, f"{directory}/{emr_train.METRICS_FILE}")
        if not metrics:
            continue
        epoch = int(metrics.pop("epoch", -1))
        if epoch >= 0 and epoch not in logged:
            stamp = int(time.time() * 1000)
            numeric = [
                mlflow.entities.Metric(k, float(v), stamp, epoch)
                for k, v in metrics.items()
                if isinstance(v, (int, float))
            ]
            mlflow_client.log_batch(mlflow_run_id, metrics=numeric)
            log.info("Backfilled MLflow metrics of checkpointed epoch %d", epoch)


def log_model(spec: TrainJobSpec, mlflow_run_id: str, checkpoint, example, read_dataset=None):
    """Rebuild the model from the best checkpoint and log it; return what the comparison scores.

    By default the torch module with MLflow's pytorch flavour (signature and input example from
    ``example``). A training module with ``serving_model(model, config, read_dataset)`` logs its own
    Python model instead (for example one that holds the vocabulary and takes raw text): MLflow's
    pyfunc flavour with the module's input example; that Python model is returned.
    """
    import importlib

    import mlflow
    import torch

    module = spec.model_module
    model = import_by_path(f"{module}:build_model")(spec.config)
    with checkpoint.as_directory() as ckpt_dir:
        emr_train.load_weights(model, ckpt_dir)
    model.eval()
    serving = getattr(importlib.import_module(module), "serving_model", None)
    ensure_credentials()
    mlflow.set_tracking_uri(spec.mlflow.tracking_uri)
    code_dir = os.path.dirname(os.path.dirname(os.path.abspath(import_by_path(f"{module}:__file__"))))
    shared = {
        "name": "model",
        "code_paths": [code_dir] if os.path.basename(code_dir) == "include" else None,
        "pip_requirements": [f"torch=={torch.__version__.split('+')[0]}", "numpy"],
    }
    with mlflow.start_run(run_id=mlflow_run_id):
        if serving is None:
            mlflow.pytorch.log_model(model, input_example=example, **shared)
            return model
        python_model, serving_example = serving(model, spec.config, read_dataset)
        mlflow.pyfunc.log_model(python_model=python_model, input_example=serving_example, **shared)
        return python_model


def log_loss_curve(mlflow_client, mlflow_run_id: str, title: str) -> None:
    """Plot the per-epoch losses (and accuracy) from MLflow's history into ``loss_curve.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = {
        key: sorted((m.step, m.value) for m in mlflow_client.get_metric_history(mlflow_run_id, key))
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
        mlflow_client.log_artifact(mlflow_run_id, path)
    plt.close(figure)
