"""The training's last step after fit: log the best checkpoint's model and the loss curve to the MLflow
run, and score the champion against the new model (:mod:`emr_ray.cluster.jobs.compare`).

It runs where it costs least. After Ray Train's ``fit()`` (``worker_group="job"``) that is the job's
driver. With a warm worker group it is the group's rank 0, still within the job's lease
(:meth:`emr_ray.cluster.jobs.train_group.TrainWorker.after_fit`): a process's first torch model log imports
``torch._dynamo`` for ``torch.export`` and checks the pinned requirements against every installed
distribution, 2-3 s that a job's fresh driver pays every time and a warm rank 0 pays once
(``bench/results/SUMMARY.md``). The MLflow credentials reach rank 0 with the call and are removed
after it; the checkpoint is read from the run's folder with the call's storage options; the champion,
a model from the registry, is scored in a process that ends with the call
(:mod:`emr_ray.cluster.jobs.clean_process`).

Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

from typing import Any

from emr_ray.cluster import batches, storage
from emr_ray.cluster.jobs import compare as comparing
from emr_ray.cluster.jobs import shards
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.jobs.train_checkpoints import StoredCheckpoint
from emr_ray.cluster.results import ChampionScores
from emr_ray.cluster.spec import TrainJobSpec


def log_and_compare(
    spec: TrainJobSpec,
    plan: dict[str, Any],
    options: storage.StorageOptions,
    mlflow_run_id: str,
    checkpoint: Any,
    *,
    isolated: bool = False,
) -> ChampionScores | None:
    """Log ``checkpoint``'s model and the loss curve, then compare with the champion (``isolated``: in
    a process of its own, :func:`emr_ray.cluster.jobs.compare.with_champion`); returns the comparison
    (None when the spec asks for none)."""
    example_set = plan["datasets"]["test" if "test" in plan["datasets"] else "train"]
    model = tracking.log_model(
        spec,
        mlflow_run_id,
        checkpoint,
        input_example(example_set, spec.config, options),
        shards.dataset_reader(plan, options),
    )
    tracking.log_loss_curve(tracking.client(spec), mlflow_run_id, spec.run_name)
    # the champion and this model on the same test rows, before the run is FINISHED (jobs/compare.py)
    return comparing.with_champion(spec, plan, options, mlflow_run_id, model, isolated=isolated)


def log_and_compare_stored(
    spec: TrainJobSpec,
    plan: dict[str, Any],
    options: storage.StorageOptions,
    mlflow_run_id: str,
    checkpoint_path: str,
) -> ChampionScores | None:
    """:func:`log_and_compare` for a checkpoint kept in the run's folder (a warm group's: the call
    passes its path, and rank 0 reads it with the call's storage options). Rank 0 serves the next
    jobs: the champion is scored in a process that ends with the call."""
    fsys, _ = storage.resolve(spec.run_uri, options)
    checkpoint = StoredCheckpoint(fsys, checkpoint_path)
    return log_and_compare(spec, plan, options, mlflow_run_id, checkpoint, isolated=True)


def input_example(entry: dict[str, Any], config: dict[str, Any], options: storage.StorageOptions):
    """Three rows of the model's input, for the logged model's signature and input example.

    Only for a model with one declared input (MLflow's torch flavour passes one tensor); a model with
    several inputs describes what it takes through its module's ``serving_model``.
    """
    if not batches.declares_batches(config):
        return None
    contract = batches.batch_spec(config)
    if len(contract.inputs) != 1:
        return None
    only = contract.inputs[0]
    pieces = [shards.Piece(entry["files"][0][0], 0, min(3, int(entry["files"][0][1])))]
    table = shards.read(pieces, storage.filesystem(entry["uri"], options), list(only.columns))
    return only.tensor(table).numpy()
