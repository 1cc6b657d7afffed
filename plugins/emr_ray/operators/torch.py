"""TorchTrainOperator: distributed PyTorch training with Ray Train's TorchTrainer, run as a Ray job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from emr_ray.cluster.results import TrainResult
from emr_ray.cluster.spec import (
    CheckpointSpec,
    CompareSection,
    FailureSpec,
    ScalingSpec,
    TrainJobSpec,
)
from emr_ray.identity import TaskIdentity
from emr_ray.operators.mlflow_job import MLflowJobOperator
from emr_ray.templating import as_bool


class TorchTrainOperator(MLflowJobOperator):
    """Train a model with ``TorchTrainer`` on the cluster; each worker reads its own rows of the staged Parquet.

    Workers read their shards straight from storage with pyarrow (``emr_ray.cluster.train.worker_shard``): equal
    training shards (so DDP workers run the same steps), no copy through the job or Ray's object store.

    The Ray Train run name and storage path come from the task instance, so an Airflow retry resumes
    from the latest checkpoint in ``<storage_path>/checkpoints/<dag_id>/<run_id>/<task_id>``, and a
    rerun of a finished training with the same inputs returns its stored result. One MLflow run per
    training task gets the params, per-epoch metrics, a ``loss_curve.png`` and the final model
    (``model``, with signature and input example). The XCom:
    ``mlflow_run_id``, ``checkpoint_uri``, ``final_metrics``, ``best_metrics``, ``epochs_completed``,
    ``comparison``, ``usage`` (what the job used, by phase: ``plan``, ``fit``, ``log``...; also logged on
    the MLflow run as ``usage.*`` metrics).

    Lineage (with Airflow's OpenLineage provider): in, the pinned generation outputs of ``datasets``; out, the
    run's model (``runs:/<run id>/model`` on the tracking server) and the best checkpoint
    (:func:`emr_ray.lineage.train_lineage`).

    With ``compare_with_model``, the job then scores ``models:/<compare_with_model>@<compare_alias>``
    and the new model on the same test rows with the training module's ``evaluate`` (see
    :mod:`emr_ray.cluster.jobs.compare`), logs both figures to the MLflow run (``compare.*``), and returns
    them as ``comparison``: :class:`~emr_ray.operators.mlflow.MLflowRegisterOperator` promotes on
    them. A rerun that reuses a finished training scores the champion again if it changed since: a
    cleared task whose earlier job compared with another champion runs a new job for that
    (:meth:`stale_result`), which returns the stored training and scores the current champion.

    :param train_loop: import path of the per-worker loop, ``include.models.tabular:train_loop`` (templated).
        Its module also provides ``build_model(config)`` (see :class:`emr_ray.cluster.train.TrainingModule`).
    :param datasets: named dataset URIs, e.g. ``{"train": ..., "test": ...}`` (templated).
    :param config: hyperparameters passed to the loop (templated).
    :param storage_path: root for checkpoints (``file://``, ``cos://``; templated).
    :param num_workers: Ray Train workers (ScalingConfig; templated).
    :param use_gpu: one GPU per worker (templated).
    :param resources_per_worker: e.g. ``{"CPU": 1}`` (templated).
    :param placement_strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD (templated).
    :param num_to_keep: checkpoints kept (CheckpointConfig).
    :param score_attribute: metric that ranks checkpoints.
    :param score_order: ``min`` or ``max``.
    :param max_failures: worker-group restarts Ray Train may do from the last checkpoint (FailureConfig).
    :param worker_group: ``"job"`` (default): Ray Train starts a worker group for this fit and stops it;
        ``"shared"``: a warm worker group that outlives the job runs the loop (torch imported, process
        group joined once; one per configuration: scaling, shipped code), stopped after
        ``worker_group_idle_timeout`` seconds unused, released when another job needs its CPUs. It
        saves Ray Train's 10-15 s of worker-group start per training here; same loop, same
        checkpoints, same resume (:mod:`emr_ray.cluster.jobs.train_group`; templated).
    :param worker_group_idle_timeout: seconds a warm worker group waits unused before it stops (templated).
    :param compare_with_model: registered model whose ``compare_alias`` version is scored against the new
        model on the same test rows after fit; None (or an empty rendering) compares nothing (templated).
    :param compare_alias: the alias of ``compare_with_model`` to compare with.

    MLflow (``mlflow_conn_id``, ``experiment_name``, ``run_tags``; the login only as secret variables, checked
    before submitting): :class:`~emr_ray.operators.mlflow_job.MLflowJobOperator`.
    """

    template_fields: Sequence[str] = (
        *MLflowJobOperator.template_fields,
        "train_loop",
        "datasets",
        "config",
        "storage_path",
        "num_workers",
        "use_gpu",
        "resources_per_worker",
        "placement_strategy",
        "compare_with_model",
        "worker_group",
        "worker_group_idle_timeout",
    )
    template_fields_renderers = {
        **MLflowJobOperator.template_fields_renderers,
        "config": "json",
        "datasets": "json",
    }
    job_module = "emr_ray.cluster.jobs.train"
    result_type = TrainResult
    ui_color = "#fbe3e8"

    def __init__(
        self,
        *,
        train_loop: str,
        datasets: dict[str, str],
        storage_path: str,
        config: dict[str, Any] | None = None,
        num_workers: int | str = 2,
        use_gpu: bool | str = False,
        resources_per_worker: dict[str, float] | None = None,
        placement_strategy: str = "PACK",
        num_to_keep: int = 2,
        score_attribute: str = "test_loss",
        score_order: str = "min",
        max_failures: int = 1,
        compare_with_model: str | None = None,
        compare_alias: str = "champion",
        worker_group: str = "job",
        worker_group_idle_timeout: int | str = 600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # not templated: checked when the DAG is parsed
        self.checkpoint = CheckpointSpec(num_to_keep, score_attribute, score_order)
        self.failure = FailureSpec(int(max_failures))
        self.train_loop = train_loop
        self.datasets = datasets
        self.storage_path = storage_path
        self.config = config or {}
        self.num_workers = num_workers
        self.use_gpu = use_gpu
        self.resources_per_worker = resources_per_worker
        self.placement_strategy = placement_strategy
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.score_order = score_order
        self.max_failures = max_failures
        self.compare_with_model = compare_with_model
        self.compare_alias = compare_alias
        self.worker_group = worker_group
        self.worker_group_idle_timeout = worker_group_idle_timeout

    def build_spec(self, context: Any, identity: TaskIdentity) -> TrainJobSpec:
        self.check_mlflow_access()
        resources = {k: float(v) for k, v in (self.resources_per_worker or {}).items()} or None
        return TrainJobSpec(
            train_loop=self.train_loop,
            datasets=dict(self.datasets or {}),
            config=dict(self.config),
            scaling=ScalingSpec(
                int(self.num_workers), as_bool(self.use_gpu), resources, self.placement_strategy
            ),
            checkpoint=self.checkpoint,
            failure=self.failure,
            run_name=identity.run_name,
            storage_path=identity.checkpoint_path(self.storage_path),
            mlflow=self.mlflow_section(context, identity),
            compare=self._compare_section(),
            worker_group=str(self.worker_group),
            worker_group_idle_timeout_s=int(self.worker_group_idle_timeout),
            tenant=self.tenant(),
        )

    def _compare_section(self) -> CompareSection | None:
        """The spec's ``compare`` part from the rendered ``compare_with_model`` (None when it is empty)."""
        name = str(self.compare_with_model or "").strip()
        if name in ("", "None"):
            return None
        return CompareSection(model_name=name, alias=self.compare_alias)

    def stale_result(self, spec: Mapping[str, Any], result: TrainResult) -> str | None:
        """A finished training that compared with the champion is reused only while that champion
        still holds the alias: else the register task would refuse to promote on a comparison with
        another model, for as long as this task reattached to the same job. A new job returns the
        stored training (no second fit) and scores the current champion on the same rows."""
        compare = spec.get("compare")
        if not compare:
            return None
        comparison = result.comparison
        if comparison is not None and comparison.skipped:
            return f"its comparison with {compare['model_name']}@{compare['alias']} was skipped ({comparison.skipped})"
        then = comparison.champion_version if comparison is not None else None
        now = self._champion_version(compare["model_name"], compare["alias"])
        if (str(then) if then else None) == now:
            return None
        return (
            f"it compared with {compare['model_name']}@{compare['alias']} "
            f"{'v' + str(then) if then else 'unset'}, which is {'v' + now if now else 'unset'} now"
        )

    def _champion_version(self, model_name: str, alias: str) -> str | None:
        """The version ``alias`` of ``model_name`` points at now, or None (no such model or alias)."""
        from mlflow.exceptions import MlflowException

        try:
            return self.mlflow_hook.get_aliases(model_name).get(alias)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def log_outcome(self, result: TrainResult) -> None:
        for epoch_metric in ("test_accuracy", "test_loss"):
            if epoch_metric in result.final_metrics:
                self.log.info("Final %s: %.4f", epoch_metric, result.final_metrics[epoch_metric])
        self.log.info("MLflow run %s, best checkpoint %s", result.mlflow_run_id, result.checkpoint_uri)
        comparison = result.comparison
        if comparison is not None and comparison.skipped:
            self.log.warning(
                "No comparison with %s@%s: %s", comparison.model_name, comparison.alias, comparison.skipped
            )
        elif comparison is not None and comparison.scored:
            self.log.info(
                "On the same %s test rows: %s v%s %s; new model %s",
                comparison.rows,
                comparison.alias,
                comparison.champion_version,
                comparison.champion,
                comparison.challenger,
            )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the pinned generation outputs in, the MLflow run's model out (never raises)."""
        from emr_ray import lineage

        result = getattr(self, "_lineage_result", None)

        def build() -> Any:
            tracking_uri = self.mlflow_hook.tracking_uri if result else None
            datasets = self.datasets if isinstance(self.datasets, dict) else {}
            return lineage.train_lineage(
                datasets=datasets, result=result, tracking_uri=tracking_uri, submission_id=self._submission_id
            )

        return lineage.collect(self.log, self.task_id, build)
