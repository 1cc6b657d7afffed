"""Register a model version from an MLflow run and promote it with aliases (champion/challenger).

MLflow deprecated model stages; this operator uses aliases only. The gate is one metric of the
source runs: the new version always becomes ``challenger``, and ``champion`` only when it beats the
current champion's value by at least ``min_improvement`` (a tie never does), or when there is no
champion yet. The rule is :func:`emr_ray.promotion.decide`; every MLflow call goes through
:class:`~emr_ray.hooks.mlflow.MLflowHook`.

Registration is idempotent: a retry, or a rerun of the same DAG run, finds the version already
registered from the same MLflow run and reuses it instead of creating a second one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from emr_ray.exceptions import MLflowRegistryError
from emr_ray.hooks.mlflow import MLflowHook
from emr_ray.hooks.mlflow_registry import TAG_ARTIFACT_PATH
from emr_ray.links.mlflow import MLflowModelVersionLink, MLflowRunLink
from emr_ray.promotion import DIRECTIONS, Decision, decide
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

    The source run must be ``FINISHED`` and carry ``metric``; otherwise nothing is registered.
    The returned XCom is a dict with ``model_name``, ``version``, ``model_uri``, ``run_id``,
    ``metric``, ``value``, ``champion_value_before``, ``promoted``, ``aliases``, ``reused``,
    ``champion_version_before`` and ``reason``.

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
    :param version_tags: extra model version tags; ``partition`` here overrides the default
        (the DAG run's ``ds``). (templated)
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
        hook.ensure_registered_model(name)
        existing = hook.find_version_from_run(name, run_id, artifact_path)
        champion_version, champion_value = self._champion(name)

        # The decision, before anything is written.
        decision = decide(
            value,
            champion_version=champion_version,
            champion_value=champion_value,
            existing_is_champion=existing is not None and str(existing.version) == champion_version,
            direction=self.direction,
            min_improvement=self.min_improvement,
            metric=self.metric,
            champion_alias=self.champion_alias,
        )
        self.log.info(
            "Run %s: %s = %s; champion %s: %s = %s",
            run_id,
            self.metric,
            value,
            f"v{champion_version}" if champion_version else "none",
            self.metric,
            champion_value,
        )
        before = {"champion_value_before": champion_value, "champion_version_before": champion_version}

        if existing is None and as_bool(self.register_only_if_better) and not decision.promote:
            self.log.info("Not registering (register_only_if_better and no improvement): %s", decision.reason)
            return self._result(name, None, run_id, value, before, decision, [], reused=False)

        if existing is not None:
            version, reused = str(existing.version), True
            self.log.info(
                "Version %s of %s was already registered from run %s; reusing it", version, name, run_id
            )
        else:
            source, model_id = hook.resolve_model_source(run, artifact_path)
            mv = hook.create_model_version(
                name,
                source=source,
                run_id=run_id,
                tags=self._version_tags(context, artifact_path),
                description=self.description,
                model_id=model_id,
            )
            version, reused = str(mv.version), False
            self.log.info("Registered %s version %s from %s", name, version, source)
            if model_id:
                hook.link_logged_model(model_id, name, version)

        hook.set_alias(name, self.challenger_alias, version)
        if decision.promote:
            hook.set_alias(name, self.champion_alias, version)
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
        result = self._result(name, version, run_id, value, before, decision, aliases, reused=reused)
        self._emit_asset_event(context, name, result)
        return result

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
        return run, float(value)

    def _champion(self, name: str) -> tuple[str | None, float | None]:
        """
        ``(version, value)`` of the current champion: ``(None, None)`` without one; value None when
        its source run is gone or lacks the metric.
        """
        version = self.hook.get_aliases(name).get(self.champion_alias)
        if version is None:
            return None, None
        source_run_id = self.hook.get_model_version(name, version).run_id
        if not source_run_id:
            return version, None
        try:
            return version, self.hook.get_metric_of_run(source_run_id, self.metric)
        except MLflowRegistryError:
            return version, None

    def _version_tags(self, context: Context, artifact_path: str) -> dict[str, str]:
        """Tags of a new version: the task instance, the partition (``ds``), then ``version_tags``."""
        ti = context["ti"]
        tags = {
            TAG_DAG_ID: ti.dag_id,
            TAG_RUN_ID: ti.run_id,
            TAG_TASK_ID: ti.task_id,
            TAG_ARTIFACT_PATH: artifact_path,
        }
        partition = context.get("ds")
        if partition:
            tags[TAG_PARTITION] = str(partition)
        map_index = getattr(ti, "map_index", -1)
        if map_index is not None and map_index >= 0:
            tags[TAG_MAP_INDEX] = str(map_index)
        tags.update({str(k): str(v) for k, v in (self.version_tags or {}).items()})
        return tags

    def _result(
        self,
        name: str,
        version: str | None,
        run_id: str,
        value: float,
        before: dict[str, Any],
        decision: Decision,
        aliases: list[str],
        *,
        reused: bool,
    ) -> dict[str, Any]:
        """The task's XCom (keys are part of the operator's interface)."""
        return {
            "model_name": name,
            "version": version,
            "model_uri": f"models:/{name}/{version}" if version else None,
            "run_id": run_id,
            "metric": self.metric,
            "value": value,
            "champion_value_before": before["champion_value_before"],
            "champion_version_before": before["champion_version_before"],
            "promoted": decision.promote,
            "aliases": aliases,
            "reused": reused,
            "reason": decision.reason,
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
