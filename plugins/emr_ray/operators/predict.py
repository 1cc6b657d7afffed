"""RayBatchPredictOperator: score a committed generation with a registered model version on the
cluster (Ray Data), committing the predictions as a new generation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from emr_ray.cluster import storage
from emr_ray.cluster.results import PredictResult
from emr_ray.cluster.spec import PredictJobSpec
from emr_ray.identity import TaskIdentity
from emr_ray.operators.mlflow_job import MLflowJobOperator
from emr_ray.params import PARTITION_TEMPLATE
from emr_ray.templating import as_bool


class RayBatchPredictOperator(MLflowJobOperator):
    """Score one committed input with one model version on Ray Data, in the cluster, not the worker.

    The job (:mod:`emr_ray.cluster.jobs.predict`) streams the input's rows through ``num_workers``
    replicas of the model (each loads the version once) and writes the predictions as it goes; the
    Airflow worker holds no row. The predictions are committed as a new generation of ``output_uri``,
    refused unless they hold exactly the input's rows. The XCom: the input generation, the model
    version, the rows, the generation committed and its ``predictions_uri``, and ``usage``.

    **One model per run.** ``model_version`` names the version; without it, the version ``alias``
    points at is resolved once, when the task builds the job's spec: a promotion during the run never
    mixes two models in one predictions generation. Resolve it in an upstream task and pass it
    templated to keep one version across the task's retries too.

    **Reuse.** A retry reattaches to its earlier try's job while the spec (the input's generation, the
    version, the settings) is unchanged and, once finished, while the generation it committed is still
    whole (:meth:`stale_result`); another version or another input gives a new job.

    **The model's code.** A registered pyfunc model runs code from the registry when it is loaded.
    The scoring replicas load it from the version's files, without any MLflow login or storage key in
    their processes (``docs/security.md``).

    :param model_name: the registered model (templated).
    :param model_version: its version number (templated); None: the version ``alias`` points at.
    :param alias: the alias resolved when ``model_version`` is not given (templated).
    :param input_uri: the output URI of a committed generation, as the preprocessing task returns it in
        its XCom ``outputs`` (``<partition>/_generations/<g>/test``; templated).
    :param output_uri: the predictions partition, committed as a new generation (templated).
    :param partition: the partition date the manifest records (templated; the run's partition by default).
    :param predict: import path of ``fn(model, batch, config) -> {column: values}``: the columns a batch
        of rows (column name to numpy array) gains (templated).
    :param config: passed to ``predict`` (templated).
    :param num_workers: at most this many model replicas, one CPU (or GPU) each; Ray Data starts one
        and adds more while rows wait (templated).
    :param batch_size: rows per batch a replica scores (templated).
    :param use_gpu: one GPU per replica (templated).
    """

    job_module = "emr_ray.cluster.jobs.predict"
    result_type = PredictResult
    template_fields: Sequence[str] = (
        *MLflowJobOperator.template_fields,
        "model_name",
        "model_version",
        "alias",
        "input_uri",
        "output_uri",
        "partition",
        "predict",
        "config",
        "num_workers",
        "batch_size",
        "use_gpu",
    )

    def __init__(
        self,
        *,
        model_name: str,
        input_uri: str,
        output_uri: str,
        model_version: str | int | None = None,
        alias: str = "champion",
        partition: str = PARTITION_TEMPLATE,
        predict: str = "include.scoring.tabular:predict_batch",
        config: dict[str, Any] | None = None,
        num_workers: int | str = 1,
        batch_size: int | str = 4096,
        use_gpu: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.model_version = model_version
        self.alias = alias
        self.input_uri = input_uri
        self.output_uri = output_uri
        self.partition = partition
        self.predict = predict
        self.config = config or {}
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.use_gpu = use_gpu

    def build_spec(self, context: Any, identity: TaskIdentity) -> PredictJobSpec:
        self.check_mlflow_access()
        return PredictJobSpec(
            partition=str(self.partition),
            input_uri=str(self.input_uri),
            output_uri=str(self.output_uri),
            model_name=str(self.model_name),
            model_version=self._version(),
            mlflow=self.mlflow_section(context, identity),
            predict=str(self.predict),
            config=dict(self.config),
            num_workers=int(self.num_workers),
            batch_size=int(self.batch_size),
            use_gpu=as_bool(self.use_gpu),
        )

    def _version(self) -> str:
        """``model_version``, or the version ``alias`` points at now (resolved once per try)."""
        given = str(self.model_version or "").strip()
        if given not in ("", "None"):
            return given
        version = str(
            self.mlflow_hook.get_model_version_by_alias(str(self.model_name), str(self.alias)).version
        )
        self.log.info("%s@%s is version %s: this run scores with it", self.model_name, self.alias, version)
        return version

    def stale_result(self, spec: Mapping[str, Any], result: PredictResult) -> str | None:
        """A finished scoring is reused only while the predictions generation it committed is whole."""
        from emr_ray.cluster import partitions

        options = self._storage_options(result.output_uri)
        try:
            committed = partitions.pinned(result.output_uri, result.generation, options)
            partitions.dataset_files(committed, "predictions", options)
        except storage.StorageError as e:
            return f"the predictions generation {result.generation} is gone or incomplete ({e})"
        return None

    def log_outcome(self, result: PredictResult) -> None:
        self.log.info(
            "Scored %d rows of generation %s with %s v%s: %s",
            result.rows,
            result.input_generation,
            result.model_name,
            result.model_version,
            result.predictions_uri,
        )
