"""The public API for user training code: what a Ray Train worker loop in ``include/`` may use.

A training module (the one ``TorchTrainOperator(train_loop="pkg.module:train_loop")`` names) follows
:class:`TrainingModule`: ``build_model(config)`` returns the ``torch.nn.Module`` (the job calls it
again to log the trained weights), and ``train_loop(config)`` runs on every Ray Train worker. It may
also provide ``evaluate(model, config, table)`` (:class:`EvaluatingModule`): with it, the job scores
the current champion and the new model on the same test rows
(``TorchTrainOperator(compare_with_model=...)``). With ``serving_model(model, config, read_dataset)``
(:class:`ServingModule`) it logs its own MLflow Python model (a vocabulary or an id index kept with the
weights, raw text or raw ids in). What the loop feeds the model is declared in its config
(:mod:`emr_ray.cluster.batches`: typed inputs, list columns). Inside the loop:

- :func:`worker_shard` gives this worker's rows of a named dataset (a pyarrow Table read straight
  from the committed Parquet files: equal shards for ``train``, all rows spread for the others);
- :func:`latest_state` gives the state to resume from (after a worker restart or an Airflow retry);
- :func:`report_epoch` reports an epoch's metrics and, from rank 0, checkpoints the model and
  optimizer in the one format the job reads back (:func:`load_weights`, :func:`read_metrics`);
- :func:`device` and :func:`prepare_model` place the model (and wrap it for data-parallel training).

The same loop runs on Ray Train's workers (``worker_group="job"``) and on a warm worker group that
outlives the job (``worker_group="shared"``, :mod:`emr_ray.cluster.jobs.train_group`): these functions are the
loop's whole view of where it runs, so a loop that uses only them runs in both.

The checkpoint files are this module's business: user code never names them, so the job can rely on
them. Runs on the cluster: never imports Airflow; torch and ray are imported inside functions.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from emr_ray.cluster.jobs import shards

#: the model and optimizer state inside a checkpoint directory
STATE_FILE = "state.pt"
#: the epoch's reported metrics inside a checkpoint directory
METRICS_FILE = "metrics.json"


class TrainingModule(Protocol):
    """What the module named by ``train_loop`` provides."""

    def build_model(self, config: dict[str, Any]) -> Any:
        """A fresh ``torch.nn.Module`` for ``config`` (the loop's config, hyperparameters included)."""

    def train_loop(self, config: dict[str, Any]) -> None:
        """The per-worker loop: read :func:`worker_shard`, train, :func:`report_epoch` every epoch."""


class EvaluatingModule(TrainingModule, Protocol):
    """A :class:`TrainingModule` that can also score a model on given rows (``evaluate`` is optional).

    The training job calls ``evaluate`` in its driver, after fit, once for the current champion
    (loaded from the registry) and once for the new model, on the same pyarrow table: every row
    of the ``test`` dataset. Both calls must measure the same thing, with the same names as the
    epoch metrics (for example ``test_accuracy``), so the register task can compare them.
    """

    def evaluate(self, model: Any, config: dict[str, Any], table: Any) -> dict[str, float]:
        """Metrics of ``model`` on ``table`` (a pyarrow Table of test rows, all columns), by name.

        ``model`` is a ``torch.nn.Module`` on the CPU: a fresh ``build_model(config)`` with the new
        weights, or the champion as MLflow loads it (which may be an exported graph module that
        refuses ``.eval()``; it was exported in eval mode). ``config`` is this training's config.
        """


class ServingModule(TrainingModule, Protocol):
    """A :class:`TrainingModule` that logs a serving model of its own (``serving_model`` is optional).

    Without it the job logs the torch module with MLflow's pytorch flavour, which takes one tensor.
    With it, the job logs what it returns with MLflow's pyfunc flavour: a model that can hold what
    scoring needs beside the weights (a vocabulary, an id index) and take raw input (text, ids).
    """

    def serving_model(self, model: Any, config: dict[str, Any], read_dataset: Any) -> tuple[Any, Any]:
        """``(python_model, input_example)``: an ``mlflow.pyfunc.PythonModel`` around the trained
        ``model`` (on the CPU, eval mode), and an input example in the raw form it takes.

        ``read_dataset(name)`` returns the whole dataset ``name`` of this training (any dataset the
        operator's ``datasets`` names) as a pyarrow Table: the vocabulary or index of exactly the
        generation the model was trained on. The champion comparison then scores these Python models
        (the new one and the champion's) with the module's ``evaluate``.
        """


@dataclass(frozen=True)
class TrainState:
    """A checkpoint as the loop wrote it: weights, optimizer state, the epoch (0-based), its metrics."""

    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    epoch: int
    metrics: dict[str, Any]


@dataclass(frozen=True)
class WarmCall:
    """What a warm worker group gives its loop in place of Ray Train's context (one call, one worker)."""

    rank: int
    world_size: int
    device: Any
    #: the job's storage options (a warm worker has no job's secrets in its environment)
    options: Any
    #: a local copy of the checkpoint to resume from, or None on a fresh start
    resume_dir: str | None
    #: ``report(metrics, checkpoint_dir or None)``: rank 0 stores the checkpoint before it returns
    report: Callable[[dict[str, Any], str | None], None]


#: set by :mod:`emr_ray.cluster.jobs.train_group` while a warm worker runs a loop; None under Ray Train
_warm: WarmCall | None = None


def _rank_and_size() -> tuple[int, int]:
    if _warm is not None:
        return _warm.rank, _warm.world_size
    import ray.train

    context = ray.train.get_context()
    return context.get_world_rank(), context.get_world_size()


def device() -> Any:
    """The ``torch.device`` this worker trains on (its GPU, or the CPU)."""
    if _warm is not None:
        return _warm.device
    from ray.train.torch import get_device

    return get_device()


def prepare_model(model: Any) -> Any:
    """``model`` on this worker's device, wrapped in ``DistributedDataParallel`` when there are several
    workers (as Ray Train's ``prepare_model`` does)."""
    if _warm is None:
        from ray.train.torch import prepare_model as ray_prepare_model

        return ray_prepare_model(model)
    model = model.to(_warm.device)
    if _warm.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    on_gpu = getattr(_warm.device, "type", "cpu") == "cuda"
    return DistributedDataParallel(model, device_ids=[_warm.device] if on_gpu else None)


def worker_shard(config: dict[str, Any], name: str, columns: list[str]):
    """This Ray Train worker's rows of dataset ``name`` (a pyarrow Table; ``None`` when it has none).

    Call inside a Ray Train loop with the ``config`` the loop received: the job put the shard plan
    there (file list and row counts, no secrets). The storage credentials come from the job's
    environment, which Ray passes on to the workers.
    """
    from emr_ray.cluster import storage
    from emr_ray.cluster.spec import StorageSection

    plan = config[shards.PLAN_KEY]
    entry = plan["datasets"][name]
    rank, world_size = _rank_and_size()
    pieces = shards.plan([(p, int(n)) for p, n in entry["files"]], world_size, equal=entry["equal"])
    if _warm is not None:
        options = _warm.options
    else:
        options = StorageSection.from_dict(plan.get("storage") or {}).options()
    return shards.read(pieces[rank], storage.filesystem(entry["uri"], options), columns)


def save_state(directory: str, *, model: Any, optimizer: Any, epoch: int, metrics: dict[str, Any]) -> None:
    """Write a checkpoint directory: the (unwrapped) model's weights, the optimizer, the metrics."""
    import torch

    unwrapped = model.module if hasattr(model, "module") else model
    state = {"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
             "epoch": int(epoch)}  # fmt: skip
    torch.save(state, os.path.join(directory, STATE_FILE))
    with open(os.path.join(directory, METRICS_FILE), "w") as f:
        json.dump(metrics, f)


def load_state(directory: str) -> TrainState:
    """Read a checkpoint directory written by :func:`save_state` (tensors on the CPU)."""
    import torch

    state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu")
    return TrainState(
        state["model"], state.get("optimizer"), int(state["epoch"]), read_metrics(directory) or {}
    )


def read_metrics(directory: str) -> dict[str, Any] | None:
    """The metrics a checkpoint directory holds, or None when it holds none."""
    path = os.path.join(directory, METRICS_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def load_weights(model: Any, directory: str) -> Any:
    """Load a checkpoint's weights into ``model`` (a fresh ``build_model(config)``); returns it."""
    model.load_state_dict(load_state(directory).model)
    return model


def latest_state() -> TrainState | None:
    """The state to resume from inside a Ray Train loop, or None on a fresh start."""
    if _warm is not None:
        return load_state(_warm.resume_dir) if _warm.resume_dir else None
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if not checkpoint:
        return None
    with checkpoint.as_directory() as directory:
        return load_state(directory)


def report_epoch(metrics: dict[str, Any], *, model: Any, optimizer: Any, epoch: int) -> None:
    """Report one epoch to Ray Train; rank 0 attaches a checkpoint of ``model`` and ``optimizer``.

    Every worker must call it once per epoch (Ray Train waits for all ranks).
    """
    metrics = {"epoch": int(epoch), **metrics}
    rank, _ = _rank_and_size()
    if _warm is not None:
        if rank != 0:
            return _warm.report(metrics, None)
        with tempfile.TemporaryDirectory() as tmp:
            save_state(tmp, model=model, optimizer=optimizer, epoch=epoch, metrics=metrics)
            return _warm.report(metrics, tmp)
    import ray.train

    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_state(tmp, model=model, optimizer=optimizer, epoch=epoch, metrics=metrics)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
