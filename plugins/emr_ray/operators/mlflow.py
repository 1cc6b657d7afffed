"""Register a model version from an MLflow run and promote it with aliases (champion/challenger).

MLflow deprecated model stages; this operator uses aliases only. The new version always becomes
``challenger``; ``champion`` moves by :func:`emr_ray.cluster.promotion.decide`, on figures that compare like
with like: when the training job scored the current champion on the challenger's own test rows
(``TorchTrainOperator(compare_with_model=...)``), those two figures decide; older runs fall back
to the metric the champion's own run logged. A NaN or infinite metric fails the task without retry
and registers nothing. Runs of historical dates (backfills, or a partition older than the
champion's) stay challenger unless ``promote_historical``.

Promotion is a compare-and-set: the champion alias is read again right before it is moved and
right after, and the decision is made again against whichever version holds it, a few times at
most. MLflow has no conditional alias write, so that leaves a window of milliseconds; run the task
in a one-slot pool (the DAGs share ``mlflow_promotion``; one pool per model also works) to close it. Every MLflow call
goes through :class:`~emr_ray.hooks.mlflow.MLflowHook`.

Registration is idempotent: a retry, or a rerun of the same DAG run, finds the version already
registered from the same MLflow run and reuses it instead of creating a second one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from emr_ray.cluster.promotion import (
    DIRECTIONS,
    TAG_COMPARE_SKIPPED,
    Comparison,
    Decision,
    NonFiniteMetricError,
    comparison_from_run,
    decide,
    historical_reason,
    require_finite,
)
from emr_ray.exceptions import MLflowMetricNotFiniteError, MLflowRegistryError
from emr_ray.hooks.mlflow import MLflowHook
from emr_ray.hooks.mlflow_registry import TAG_ARTIFACT_PATH
from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.params import PROMOTION_POOL, run_partition, run_type
from emr_ray.templating import as_bool

if TYPE_CHECKING:
    from airflow.sdk import Context
    from mlflow.entities import Run

#: Scheme of the Airflow asset that stands for a registered MLflow model.
ASSET_URI_PREFIX = "x-mlflow://models/"

#: Version tags the operator writes (besides the caller's ``version_tags``).
TAG_DAG_ID = "airflow.dag_id"
TAG_RUN_ID = "airflow.run_id"
TAG_TASK_ID = "airflow.task_id"
TAG_MAP_INDEX = "airflow.map_index"
TAG_PARTITION = "partition"

#: How many times one task decides at most when the champion alias keeps moving under it.
MAX_DECISIONS = 4
#: How long to wait after moving the champion alias before reading it back (a concurrent writer's
#: request in flight lands within that time). No wait in the one-slot promotion pool, where no other
#: promotion of the model runs at the same time: :meth:`MLflowRegisterOperator.alias_settle_seconds`.
ALIAS_SETTLE_SECONDS = 1.0


@dataclass(frozen=True)
class Champion:
    """The version the champion alias points at, as read for one decision."""

    version: str | None = None
    #: the metric its own source run logged (None when the run is gone or lacks it)
    value: float | None = None
    #: its ``partition`` tag
    partition: str | None = None


@dataclass(frozen=True)
class Candidate:
    """What is known of the run being registered, for every decision about it."""

    run_id: str
    #: its gate metric, as its run logged it (finite)
    value: float
    #: both models' figures on its test rows, when the training job made them
    comparison: Comparison | None
    #: the partition its version is (or will be) tagged with
    partition: str | None
    #: the DAG run's ``run_type`` (``backfill``, ``manual``, ``scheduled``)
    run_type: str | None

    def historical(self, champion: Champion) -> str | None:
        """Why this run is historical next to ``champion``, or None."""
        return historical_reason(
            run_type=self.run_type, partition=self.partition, champion_partition=champion.partition
        )


def mlflow_model_asset(model_name: str) -> Asset:
    """
    The Airflow asset for registered model ``model_name`` (``x-mlflow://models/<name>``).

    Schedule a downstream DAG on it to run whenever a version is registered; each asset event's
    ``extra`` carries the version, its metric value and whether it was promoted.

    :param model_name: the registered model's name.
    """
    uri = f"{ASSET_URI_PREFIX}{model_name}"
    return Asset(name=uri, uri=uri, group="model")


class MLflowRegisterOperator(BaseOperator):
    """
    Register the model an MLflow run logged, tag it, and move ``challenger`` / ``champion`` aliases.

    The source run must be ``FINISHED`` and carry a finite ``metric``; otherwise nothing is
    registered (a NaN or infinite value fails the task without retry:
    :class:`~emr_ray.exceptions.MLflowMetricNotFiniteError`). The returned XCom is a dict with
    ``model_name``, ``version``, ``model_uri``, ``run_id``, ``metric``, ``value``,
    ``champion_value_before`` and ``champion_version_before`` (the champion the final decision was
    made against), ``promoted``, ``aliases``, ``reused``, ``reason``, and:

    - ``comparison``: what the training job scored on the challenger's own test rows, or None:
      ``champion_version``, ``rows``, ``challenger_value``, ``champion_value``;
    - ``same_rows``: whether the decision compared two figures from the same rows;
    - ``historical``: whether the run counts as historical (a backfill, or a partition older than
      the champion's);
    - ``decisions``: how many times the decision was made (more than 1 when the champion alias
      moved while this task was deciding).

    Run it in a one-slot pool (``pool="mlflow_promotion"``, which must exist: ``airflow pools set
    mlflow_promotion 1 ...``): two promotions of one model are then one after the other, and the
    second decides against the first's result. Outside that pool a promotion also waits
    :data:`ALIAS_SETTLE_SECONDS` after moving the alias before it reads it back, for a concurrent
    writer's request in flight to land.

    Each new version carries a receipt (:mod:`emr_ray.receipt`, ``receipt.*`` tags): the CPU- and
    GPU-seconds of every upstream task (with its share of warm pools' idle time), their cost by the
    ``emr_ray_prices`` Variable when it is set, the code version and libraries the cluster ran, and
    the training's input fingerprint.

    Lineage (with Airflow's OpenLineage provider): the run's model (``runs:/<run id>/<artifact_path>``)
    in, the model version (``models:/<name>/<version>``) out, tagged with its aliases and the decision
    (:func:`emr_ray.lineage.register_lineage`).

    :param model_name: registered model name; created when missing. (templated)
    :param run_id: MLflow run that logged the model, typically the training task's XCom. (templated)
    :param artifact_path: name the model was logged under (``log_model(name=...)``). (templated)
    :param metric: run metric that decides promotion, e.g. ``test_accuracy``. (templated)
    :param direction: ``max`` when higher is better, ``min`` when lower is better.
    :param min_improvement: how much the new value must beat the champion's by (absolute, >= 0);
        a tie never promotes.
    :param challenger_alias: alias every newly registered version gets.
    :param champion_alias: alias of the version in production.
    :param register_only_if_better: register nothing unless the run beats the champion (templated:
        ``"{{ params.register_only_if_better }}"`` works).
    :param promote_historical: let a historical run (a backfill, or a partition older than the
        champion's ``partition`` tag) replace the champion; by default it stays challenger
        (templated: ``"{{ params.promote_historical }}"`` works).
    :param version_tags: extra model version tags; ``partition`` here overrides the default (the
        run's partition, :func:`emr_ray.params.run_partition`, as the training run's tag). Pass the
        training task's ``run_tags`` here too, so the run and the version agree. (templated)
    :param description: model version description. (templated)
    :param mlflow_conn_id: Airflow connection of type ``mlflow``.
    :param emit_asset: add :func:`mlflow_model_asset` of ``model_name`` to ``outlets`` (only when
        ``model_name`` is not a template, since outlets are fixed when the DAG is parsed) and fill
        its event's ``extra``.
    """

    template_fields: Sequence[str] = (
        "model_name",
        "run_id",
        "artifact_path",
        "metric",
        "version_tags",
        "description",
        "register_only_if_better",
        "promote_historical",
    )
    template_fields_renderers = {"version_tags": "json"}
    ui_color = "#d5e8f7"
    operator_extra_links = (MLflowRunLink(), MLflowModelVersionLink())

    def __init__(
        self,
        *,
        model_name: str,
        run_id: str,
        artifact_path: str = "model",
        metric: str = "test_accuracy",
        direction: str = "max",
        min_improvement: float = 0.0,
        challenger_alias: str = "challenger",
        champion_alias: str = "champion",
        register_only_if_better: bool | str = False,
        promote_historical: bool | str = False,
        version_tags: dict[str, str] | None = None,
        description: str | None = None,
        mlflow_conn_id: str = MLflowHook.default_conn_name,
        emit_asset: bool = True,
        **kwargs: Any,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction={direction!r} is not supported; use 'max' or 'min'.")
        if min_improvement < 0:
            raise ValueError(
                f"min_improvement={min_improvement!r} must be >= 0; it is the margin by which a new "
                "model must beat the champion, in the metric's own units."
            )
        if challenger_alias == champion_alias:
            raise ValueError(
                f"challenger_alias and champion_alias are both {champion_alias!r}; give them different names."
            )
        if emit_asset and "{{" not in model_name and "{%" not in model_name:
            asset = mlflow_model_asset(model_name)
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, list | tuple) else [outlets]
            if asset not in outlets:
                kwargs["outlets"] = [*outlets, asset]
        super().__init__(**kwargs)
        self.model_name = model_name
        self.run_id = run_id
        self.artifact_path = artifact_path
        self.metric = metric
        self.direction = direction
        self.min_improvement = float(min_improvement)
        self.challenger_alias = challenger_alias
        self.champion_alias = champion_alias
        self.register_only_if_better = register_only_if_better
        self.promote_historical = promote_historical
        self.version_tags = version_tags
        self.description = description
        self.mlflow_conn_id = mlflow_conn_id
        self.emit_asset = emit_asset

    @cached_property
    def hook(self) -> MLflowHook:
        """The MLflow hook of ``mlflow_conn_id``."""
        return MLflowHook(mlflow_conn_id=self.mlflow_conn_id)

    # ------------------------------------------------------------------ execute
    def execute(self, context: Context) -> dict[str, Any]:
        name, run_id, artifact_path = self._rendered()
        hook = self.hook

        run, value = self._check_run(run_id)
        MLflowRunLink.persist(context, hook.run_url(run.info.experiment_id, run_id))
        comparison = self._comparison(run, name)
        hook.ensure_registered_model(name)
        existing = hook.find_version_from_run(name, run_id, artifact_path)
        tags = self._version_tags(context, artifact_path)
        candidate = Candidate(
            run_id=run_id,
            value=value,
            comparison=comparison,
            partition=(existing.tags if existing is not None else tags).get(TAG_PARTITION),
            run_type=run_type(context),
        )

        # The decision, before anything is written.
        champion = self._champion(name)
        existing_version = str(existing.version) if existing is not None else None
        decision = self._decide(candidate, champion, existing_version)
        self._log_figures(run_id, value, champion, comparison)

        if existing is None and as_bool(self.register_only_if_better) and not decision.promote:
            self.log.info("Not registering (register_only_if_better and no improvement): %s", decision.reason)
            self._lineage_result = self._result(name, None, candidate, champion, decision, [], reused=False)
            return self._lineage_result

        # the run names the model before a version exists: retention finds the version from the run
        # (emr_ray.registry_lineage), so the data it was trained on is never judged unneeded by a list
        hook.record_registration(run_id, dict(run.data.tags), name)
        if existing is not None:
            version, reused = str(existing.version), True
            self.log.info(
                "Version %s of %s was already registered from run %s; reusing it", version, name, run_id
            )
        else:
            source, model_id = hook.resolve_model_source(run, artifact_path)
            mv = hook.create_model_version(
                name, source=source, run_id=run_id, tags=tags, description=self.description, model_id=model_id
            )
            version, reused = str(mv.version), False
            self.log.info("Registered %s version %s from %s", name, version, source)
            if model_id:
                hook.link_logged_model(model_id, name, version)

        hook.set_alias(name, self.challenger_alias, version)
        decision, champion, decisions = self._promote(name, version, candidate, champion, decision)
        aliases = hook.aliases_of_version(name, version)
        self.log.info(
            "Decision for %s v%s: %s (%s); aliases now %s",
            name,
            version,
            "PROMOTED to " + self.champion_alias if decision.promote else "challenger only",
            decision.reason,
            aliases,
        )
        MLflowModelVersionLink.persist(context, hook.model_version_url(name, version))
        result = self._result(
            name, version, candidate, champion, decision, aliases, reused=reused, decisions=decisions
        )
        self._emit_asset_event(context, name, result)
        self._lineage_result = result
        return result

    def _decide(self, candidate: Candidate, champion: Champion, version: str | None) -> Decision:
        """:func:`~emr_ray.cluster.promotion.decide` on ``candidate`` (``version`` once registered) and ``champion``."""
        try:
            return decide(
                candidate.value,
                champion_version=champion.version,
                champion_value=champion.value,
                existing_is_champion=version is not None and version == champion.version,
                direction=self.direction,
                min_improvement=self.min_improvement,
                metric=self.metric,
                champion_alias=self.champion_alias,
                comparison=candidate.comparison,
                historical=candidate.historical(champion),
                promote_historical=as_bool(self.promote_historical),
            )
        except NonFiniteMetricError as e:
            raise MLflowMetricNotFiniteError(f"MLflow run {candidate.run_id!r}: {e}") from e

    def _promote(
        self, name: str, version: str, candidate: Candidate, champion: Champion, decision: Decision
    ) -> tuple[Decision, Champion, int]:
        """
        Move the champion alias to ``version`` when ``decision`` says so, as a compare-and-set.

        Right before the write the alias is read again: when it moved since ``champion`` was read,
        the decision is made again against the version that holds it now. After the write it is
        read back once a concurrent write in flight has landed: when another task moved it in
        between, the decision is made again against that version (which, if this one is better,
        moves the alias back). At most :data:`MAX_DECISIONS` decisions; returns the final
        decision, the champion it was made against and how many decisions were made.
        """
        hook, alias = self.hook, self.champion_alias
        decisions = 1
        while True:
            if not decision.promote:
                return decision, champion, decisions
            current = hook.get_aliases(name).get(alias)
            if current == version:
                return decision, champion, decisions
            if current == champion.version:
                hook.set_alias(name, alias, version)
                time.sleep(self.alias_settle_seconds)
                current = hook.get_aliases(name).get(alias)
                if current == version:
                    return decision, champion, decisions
                self.log.warning(
                    "%s moved to v%s right after this task set it to v%s (a concurrent promotion); "
                    "deciding again against v%s",
                    alias,
                    current,
                    version,
                    current,
                )
            else:
                self.log.warning(
                    "%s moved from %s to %s since this task decided; deciding again against it",
                    alias,
                    f"v{champion.version}" if champion.version else "none",
                    f"v{current}" if current else "none",
                )
            if decisions >= MAX_DECISIONS:
                break
            champion = self._champion(name)
            decision = self._decide(candidate, champion, version)
            decisions += 1
        holder = hook.get_aliases(name).get(alias)
        return (
            Decision(
                False,
                f"{alias} moved {MAX_DECISIONS} times while this task was deciding (concurrent promotions); "
                f"it stays v{holder}. Run promotions of one model in a one-slot pool, then rerun this task",
            ),
            champion,
            MAX_DECISIONS,
        )

    @property
    def alias_settle_seconds(self) -> float:
        """0 in the one-slot promotion pool (no other promotion of the model is in flight there),
        else :data:`ALIAS_SETTLE_SECONDS`."""
        return 0.0 if self.pool == PROMOTION_POOL else ALIAS_SETTLE_SECONDS

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the run's model in, the model version and its aliases out (never raises)."""
        from emr_ray import lineage

        result = getattr(self, "_lineage_result", None)

        def build() -> Any:
            run_id = str((result or {}).get("run_id") or self.run_id).strip()
            if run_id in ("", "None") or "{{" in run_id:
                return None  # failed before the run id was known: nothing to report
            artifact_path = str(self.artifact_path).strip().strip("/")
            return lineage.register_lineage(
                run_id=run_id,
                artifact_path=artifact_path,
                tracking_uri=self.hook.tracking_uri,
                registry_uri=self.hook.registry_uri,
                result=result,
            )

        return lineage.collect(self.log, self.task_id, build)

    # ------------------------------------------------------------------ helpers
    def _rendered(self) -> tuple[str, str, str]:
        """``(model_name, run_id, artifact_path)`` as rendered, stripped and checked."""
        name = str(self.model_name).strip()
        run_id = str(self.run_id).strip()
        artifact_path = str(self.artifact_path).strip().strip("/")
        if not name:
            raise MLflowRegistryError("model_name rendered empty; pass the registered model's name.")
        if not run_id or run_id == "None":
            raise MLflowRegistryError(
                f"run_id rendered {self.run_id!r}; pass the MLflow run id the training task returned "
                "(for example its XCom 'mlflow_run_id')."
            )
        return name, run_id, artifact_path

    def _check_run(self, run_id: str) -> tuple[Run, float]:
        """The source run and its gate metric; refuses an unfinished run and one without the metric."""
        run = self.hook.get_run(run_id)
        status = run.info.status
        if status != "FINISHED":
            raise MLflowRegistryError(
                f"MLflow run {run_id!r} has status {status}, not FINISHED: no model is registered from a "
                "failed or unfinished run. Fix the training task and let it finish, then rerun this task."
            )
        value = run.data.metrics.get(self.metric)
        if value is None:
            logged = ", ".join(sorted(run.data.metrics)) or "none"
            raise MLflowRegistryError(
                f"MLflow run {run_id!r} has no metric {self.metric!r} (it logged: {logged}). Log "
                f"{self.metric!r} in the training job, or set metric= to one the run logged."
            )
        try:
            return run, require_finite(float(value), metric=self.metric, where=f"MLflow run {run_id!r}")
        except NonFiniteMetricError as e:
            raise MLflowMetricNotFiniteError(str(e)) from e

    def _comparison(self, run: Run, name: str) -> Comparison | None:
        """The figures the training job scored on the run's own test rows, or None (logged either way)."""
        tags = run.data.tags
        comparison = comparison_from_run(tags, run.data.metrics, model_name=name, metric=self.metric)
        if comparison is None:
            skipped = tags.get(TAG_COMPARE_SKIPPED)
            self.log.info(
                "The training run made no comparison on its test rows (%s); the champion is judged by the "
                "%s its own run logged",
                skipped or "TorchTrainOperator(compare_with_model=...) was not set",
                self.metric,
            )
        return comparison

    def _log_figures(
        self, run_id: str, value: float, champion: Champion, comparison: Comparison | None
    ) -> None:
        self.log.info(
            "Run %s: %s = %s; champion %s: %s = %s (as its own run logged)",
            run_id,
            self.metric,
            value,
            f"v{champion.version}" if champion.version else "none",
            self.metric,
            champion.value,
        )
        if comparison is not None and comparison.champion_version:
            self.log.info(
                "On the same %s test rows the training scored: challenger %s = %s, champion v%s %s = %s",
                comparison.rows,
                self.metric,
                comparison.challenger_value,
                comparison.champion_version,
                self.metric,
                comparison.champion_value,
            )

    def _champion(self, name: str) -> Champion:
        """
        The current champion: :class:`Champion` with no version without one; value None when its
        source run is gone or lacks the metric.
        """
        version = self.hook.get_aliases(name).get(self.champion_alias)
        if version is None:
            return Champion()
        model_version = self.hook.get_model_version(name, version)
        partition = (model_version.tags or {}).get(TAG_PARTITION)
        if not model_version.run_id:
            return Champion(version, None, partition)
        try:
            return Champion(
                version, self.hook.get_metric_of_run(model_version.run_id, self.metric), partition
            )
        except MLflowRegistryError:
            return Champion(version, None, partition)

    def _version_tags(self, context: Context, artifact_path: str) -> dict[str, str]:
        """Tags of a new version: the task instance, the run's partition (the training run's default tag
        too), then ``version_tags``."""
        ti = context["ti"]
        tags = {
            TAG_DAG_ID: ti.dag_id,
            TAG_RUN_ID: ti.run_id,
            TAG_TASK_ID: ti.task_id,
            TAG_ARTIFACT_PATH: artifact_path,
        }
        partition = run_partition(context)
        if partition:
            tags[TAG_PARTITION] = partition
        map_index = getattr(ti, "map_index", -1)
        if map_index is not None and map_index >= 0:
            tags[TAG_MAP_INDEX] = str(map_index)
        tags.update(self._receipt(context))
        tags.update({str(k): str(v) for k, v in (self.version_tags or {}).items()})
        return tags

    def _receipt(self, context: Context) -> dict[str, str]:
        """The version's receipt (:mod:`emr_ray.receipt`): what the upstream tasks returned (their
        usage, the code and libraries the cluster ran, the input fingerprint), priced by the
        ``emr_ray_prices`` Variable when it is set. Never fails the registration."""
        from emr_ray import receipt

        try:
            ti = context["ti"]
            upstream = sorted(self.get_flat_relative_ids(upstream=True))
            results = {task_id: ti.xcom_pull(task_ids=task_id) for task_id in upstream}
            from airflow.sdk import Variable

            prices, problem = receipt.parse_prices(Variable.get(receipt.PRICES_VARIABLE, default=None))
            if problem:
                self.log.warning("%s", problem)
            return receipt.tags(results, prices)
        except Exception as e:  # the receipt is a record, not a condition of registering
            self.log.warning("No receipt on this version (%s: %s)", type(e).__name__, e)
            return {}

    def _result(
        self,
        name: str,
        version: str | None,
        candidate: Candidate,
        champion: Champion,
        decision: Decision,
        aliases: list[str],
        *,
        reused: bool,
        decisions: int = 1,
    ) -> dict[str, Any]:
        """The task's XCom (keys are part of the operator's interface)."""
        comparison = candidate.comparison
        return {
            "model_name": name,
            "version": version,
            "model_uri": f"models:/{name}/{version}" if version else None,
            "run_id": candidate.run_id,
            "metric": self.metric,
            "value": candidate.value,
            "champion_value_before": champion.value,
            "champion_version_before": champion.version,
            "promoted": decision.promote,
            "aliases": aliases,
            "reused": reused,
            "reason": decision.reason,
            "comparison": None
            if comparison is None
            else {
                "champion_version": comparison.champion_version,
                "rows": comparison.rows,
                "challenger_value": comparison.challenger_value,
                "champion_value": comparison.champion_value,
            },
            "same_rows": decision.same_rows,
            "historical": candidate.historical(champion) is not None,
            "decisions": decisions,
        }

    def _emit_asset_event(self, context: Context, name: str, result: dict[str, Any]) -> None:
        if not self.emit_asset or result["version"] is None:
            return
        target = f"{ASSET_URI_PREFIX}{name}"
        for outlet in self.outlets or []:
            if isinstance(outlet, Asset) and outlet.uri == target:
                context["outlet_events"][outlet].extra = {
                    "model_name": name,
                    "version": result["version"],
                    "model_uri": result["model_uri"],
                    "run_id": result["run_id"],
                    "metric": result["metric"],
                    "value": result["value"],
                    "champion_value_before": result["champion_value_before"],
                    "promoted": result["promoted"],
                    "aliases": result["aliases"],
                }
