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
loop's whole view of where it runs (a :class:`TrainContext` of either kind), so a loop that uses only them
runs in both.

The checkpoint files are this module's business: user code never names them, so the job can rely on
them. Runs on the cluster: never imports Airflow; torch and ray are imported inside functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from emr_ray.cluster.jobs import shards

#: the model and optimizer state inside a checkpoint directory
STATE_FILE = "state.pt"
#: the epoch's reported metrics inside a checkpoint directory
METRICS_FILE = "metrics.json"
#: the fingerprint of the inputs the checkpoint was trained on, inside its directory
INPUTS_FILE = "inputs.json"


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
    #: the fingerprint of the inputs it was trained on (None: written without one)
    inputs: str | None = None


class TrainContext:
    """Where the loop runs, as the public functions below see it: Ray Train's worker group
    (:class:`RayTrainContext`) or a warm worker group's call (:class:`WarmGroupContext`), as Ray Train
    v2 gives its loop a train context. :func:`get_context` is the running one."""

    #: the fingerprint of the run's inputs (its job's plan carries it): every checkpoint carries it,
    #: and a checkpoint of other inputs is never resumed from (:func:`latest_state`)
    inputs: str | None = None

    def rank_and_size(self) -> tuple[int, int]:
        raise NotImplementedError

    def device(self) -> Any:
        raise NotImplementedError

    def prepare_model(self, model: Any) -> Any:
        raise NotImplementedError

    def storage_options(self, plan: dict[str, Any]) -> Any:
        """The storage options the loop reads its shards with."""
        raise NotImplementedError

    def latest_state(self) -> TrainState | None:
        raise NotImplementedError

    def report(self, metrics: dict[str, Any], directory: str | None) -> None:
        """Report an epoch's metrics, with rank 0's checkpoint directory (None on other ranks). The
        context owns the directory from here on: it removes it once the checkpoint is stored."""
        raise NotImplementedError


class RayTrainContext(TrainContext):
    """Ray Train's own worker group (``worker_group="job"``): its context, its checkpoints."""

    def __init__(self, inputs: str | None = None) -> None:
        self.inputs = inputs

    def rank_and_size(self) -> tuple[int, int]:
        import ray.train

        context = ray.train.get_context()
        return context.get_world_rank(), context.get_world_size()

    def device(self) -> Any:
        from ray.train.torch import get_device

        return get_device()

    def prepare_model(self, model: Any) -> Any:
        from ray.train.torch import prepare_model as ray_prepare_model

        return ray_prepare_model(model)

    def storage_options(self, plan: dict[str, Any]) -> Any:
        """From the plan; the credentials from the job's environment, which Ray passes to the workers."""
        from emr_ray.cluster.spec import StorageSection

        return StorageSection.from_dict(plan.get("storage") or {}).options()

    def latest_state(self) -> TrainState | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if not checkpoint:
            return None
        with checkpoint.as_directory() as directory:
            try:
                return load_state(directory)
            except Exception as e:  # truncated or corrupt: every retry would meet it again
                logging.getLogger(__name__).warning(
                    "The latest checkpoint %s cannot be read (%s: %s): starting fresh; it stays for inspection",
                    checkpoint.path,
                    type(e).__name__,
                    e,
                )
                return None

    def report(self, metrics: dict[str, Any], directory: str | None) -> None:
        """Report in the background (Ray Train's ``ASYNC`` mode): the checkpoint is uploaded and the
        report handed to the controller (which takes one every 2 s) while the next epoch runs; Ray
        Train keeps the reports in order, takes a checkpoint as the run's latest only once it is
        stored whole, removes the local copy, and waits for the uploads before the loop's end."""
        import ray.train
        from ray.train import CheckpointUploadMode

        checkpoint = ray.train.Checkpoint.from_directory(directory) if directory else None
        ray.train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            delete_local_checkpoint_after_upload=True,
        )


@dataclass(frozen=True)
class WarmGroupContext(TrainContext):
    """One call of a warm worker group on one worker (:mod:`emr_ray.cluster.jobs.train_group`)."""

    rank: int
    world_size: int
    torch_device: Any
    #: the job's storage options (a warm worker has no job's secrets in its environment)
    options: Any
    #: a local copy of the checkpoint to resume from, or None on a fresh start
    resume_dir: str | None
    #: ``report(metrics, checkpoint_dir or None)``: rank 0 stores the checkpoint before it returns
    reporter: Callable[[dict[str, Any], str | None], None]
    inputs: str | None = None

    def rank_and_size(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def device(self) -> Any:
        return self.torch_device

    def prepare_model(self, model: Any) -> Any:
        model = model.to(self.torch_device)
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = getattr(self.torch_device, "type", "cpu") == "cuda"
        return DistributedDataParallel(model, device_ids=[self.torch_device] if on_gpu else None)

    def storage_options(self, plan: dict[str, Any]) -> Any:
        return self.options

    def latest_state(self) -> TrainState | None:
        return load_state(self.resume_dir) if self.resume_dir else None

    def report(self, metrics: dict[str, Any], directory: str | None) -> None:
        self.reporter(metrics, directory)


_RAY_TRAIN = RayTrainContext()
#: the warm group's context while one of its calls runs on this worker (:func:`running_in`)
_context: TrainContext | None = None


def get_context() -> TrainContext:
    """The running loop's context: a warm group's call, else Ray Train's."""
    return _context or _RAY_TRAIN


def with_inputs_of_plan(train_loop: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``train_loop`` for Ray Train's workers, run with the input fingerprint of the job's plan in
    its context (a warm group's call sets it itself), so that its checkpoints carry it."""

    def loop(config: dict[str, Any]) -> None:
        with running_in(RayTrainContext(inputs_of_plan(config))):
            train_loop(config)

    return loop


def inputs_of_plan(config: dict[str, Any]) -> str | None:
    """The input fingerprint the job put in the loop's ``config`` (its shard plan), or None."""
    return (config.get(shards.PLAN_KEY) or {}).get("inputs")


@contextlib.contextmanager
def running_in(context: TrainContext) -> Iterator[TrainContext]:
    """Run a loop in ``context`` (a warm worker's call); Ray Train's again afterwards."""
    global _context
    _context = context
    try:
        yield context
    finally:
        _context = None


def device() -> Any:
    """The ``torch.device`` this worker trains on (its GPU, or the CPU)."""
    return get_context().device()


def prepare_model(model: Any) -> Any:
    """``model`` on this worker's device, wrapped in ``DistributedDataParallel`` when there are several
    workers (as Ray Train's ``prepare_model`` does)."""
    return get_context().prepare_model(model)


def worker_shard(config: dict[str, Any], name: str, columns: list[str]):
    """This Ray Train worker's rows of dataset ``name`` (a pyarrow Table; ``None`` when it has none).

    Call inside a Ray Train loop with the ``config`` the loop received: the job put the shard plan
    there (file list and row counts, no secrets). The storage credentials come from the job's
    environment, which Ray passes on to the workers.
    """
    from emr_ray.cluster import storage

    plan = config[shards.PLAN_KEY]
    entry = plan["datasets"][name]
    context = get_context()
    rank, world_size = context.rank_and_size()
    pieces = shards.plan([(p, int(n)) for p, n in entry["files"]], world_size, equal=entry["equal"])
    return shards.read(pieces[rank], storage.filesystem(entry["uri"], context.storage_options(plan)), columns)


def save_state(
    directory: str,
    *,
    model: Any,
    optimizer: Any,
    epoch: int,
    metrics: dict[str, Any],
    inputs: str | None = None,
) -> None:
    """Write a checkpoint directory: the (unwrapped) model's weights, the optimizer, the fingerprint
    of the inputs it was trained on (``inputs``), the metrics (last)."""
    import torch

    unwrapped = model.module if hasattr(model, "module") else model
    state = {
        "model": unwrapped.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer else None,
        "epoch": int(epoch),
    }
    torch.save(state, os.path.join(directory, STATE_FILE))
    if inputs:
        with open(os.path.join(directory, INPUTS_FILE), "w") as f:
            json.dump({"fingerprint": inputs}, f)
    with open(os.path.join(directory, METRICS_FILE), "w") as f:
        json.dump(metrics, f)


def load_state(directory: str) -> TrainState:
    """Read a checkpoint directory written by :func:`save_state` (tensors on the CPU)."""
    import torch

    state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu")
    return TrainState(
        state["model"],
        state.get("optimizer"),
        int(state["epoch"]),
        read_metrics(directory) or {},
        read_inputs(directory),
    )


def read_inputs(directory: str) -> str | None:
    """The fingerprint of the inputs a checkpoint directory was trained on, or None (none written, or
    unreadable: such a checkpoint is never resumed from)."""
    found = _read_json_file(os.path.join(directory, INPUTS_FILE))
    return found.get("fingerprint") if found else None


def read_metrics(directory: str) -> dict[str, Any] | None:
    """The metrics a checkpoint directory holds, or None when it holds none or they are unreadable
    (a truncated file: logged, the file left in place for inspection; never a failure every retry
    meets again)."""
    return _read_json_file(os.path.join(directory, METRICS_FILE))


def _read_json_file(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return parse_json_object(f.read(), path)


def parse_json_object(raw: bytes, where: str) -> dict[str, Any] | None:
    """The JSON object a checkpoint file holds, or None (logged) when it is not one: a file cut off
    mid-write counts as absent, and stays where it is for inspection."""
    try:
        found = json.loads(raw.decode())
    except ValueError as e:
        logging.getLogger(__name__).warning("Ignoring %s: it is not readable JSON (%s)", where, e)
        return None
    return found if isinstance(found, dict) else None


def load_weights(model: Any, directory: str) -> Any:
    """Load a checkpoint's weights into ``model`` (a fresh ``build_model(config)``); returns it."""
    model.load_state_dict(load_state(directory).model)
    return model


def latest_state() -> TrainState | None:
    """The state to resume from inside a Ray Train loop, or None on a fresh start: never a checkpoint
    trained on other inputs than this run's (or on inputs it cannot name), whatever left it there."""
    context = get_context()
    state = context.latest_state()
    if state is not None and context.inputs and state.inputs != context.inputs:
        logging.getLogger(__name__).warning(
            "The latest checkpoint (epoch %d) was trained on other inputs (%s; this run's: %s): "
            "starting fresh instead of resuming from it.",
            state.epoch,
            state.inputs or "unnamed",
            context.inputs,
        )
        return None
    return state


def report_epoch(metrics: dict[str, Any], *, model: Any, optimizer: Any, epoch: int) -> None:
    """Report one epoch to Ray Train; rank 0 attaches a checkpoint of ``model`` and ``optimizer``.

    Every worker must call it once per epoch (Ray Train waits for all ranks).
    """
    metrics = {"epoch": int(epoch), **metrics}
    context = get_context()
    rank, _ = context.rank_and_size()
    if rank != 0:
        context.report(metrics, None)
        return
    # the context stores the checkpoint off the training step's path and removes this folder after
    tmp = tempfile.mkdtemp(prefix="emr_ray_checkpoint_")
    save_state(tmp, model=model, optimizer=optimizer, epoch=epoch, metrics=metrics, inputs=context.inputs)
    context.report(metrics, tmp)
