"""Housekeeping of produced partitions as a task: :class:`PartitionHousekeepingOperator`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from emr_ray.cluster import retention
from emr_ray.cluster.model_retention import DEFAULT_KEEP_DAYS, DEFAULT_KEEP_NEWEST, VersionPolicy
from emr_ray.exceptions import RegistryIncompleteError
from emr_ray.templating import as_bool, as_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context


class PartitionHousekeepingOperator(BaseOperator):
    """
    Remove what no one needs from the partitions of some datasets, by the rules of
    :mod:`emr_ray.cluster.retention`: never the newest ``keep`` commits, never a generation superseded
    less than ``retention`` ago, never one that a pin or a kept model version names; uncommitted
    generations once their writer was inactive for ``abandon_after``. A training's pin is released once
    the registry says no version registered from its run is kept: one holding an alias, among the
    newest ``keep_versions`` of its model, or registered within ``keep_version_days``. No list of models
    is needed (:mod:`emr_ray.registry_lineage`); when the registry cannot answer completely (MLflow down,
    a model this login may not read) no committed data is removed and the task fails saying why.
    **A dry run unless** ``remove``: the log and the XCom say what would go and why (``planned``,
    ``by_kind``, ``removed``, ``failed``), and the bytes each model's kept versions hold
    (``kept_bytes_by_model``).

    The same pass runs from a shell: ``python -m emr_ray.housekeeping sweep ...`` (:mod:`emr_ray.housekeeping`).

    :param dataset_uris: dataset folders holding ``dt=...`` partitions (templated).
    :param model_names: models that must be readable besides those the registry lists (optional;
        templated): one that cannot be read then stops removal.
    :param remove: remove what the rules allow; False (default): only say what would be removed
        (templated: ``"{{ not params.dry_run }}"`` works).
    :param retention: how long a superseded generation stays at least (timedelta or seconds; 7 days).
    :param keep: committed generations always kept per partition (3).
    :param expire_after: time after its newest commit when a partition that no pin or kept version
        holds is removed whole (timedelta or seconds; None, the default: never, and storage grows with
        every date). For staged data that its preprocessing can produce again, not for outputs people read.
    :param keep_versions: newest versions of each model whose data is kept (3).
    :param keep_version_days: days a version keeps its data after it was registered (7).
    :param abandon_after: inactivity after which an uncommitted generation is abandoned (6 h, 1 h at least).
    :param cos_conn_id: the ``cos`` connection of ``cos://`` datasets.
    :param mlflow_conn_id: the ``mlflow`` connection of the registry.
    """

    template_fields: Sequence[str] = ("dataset_uris", "model_names", "remove")
    ui_color = "#e8e8e8"

    def __init__(
        self,
        *,
        dataset_uris: Sequence[str],
        model_names: Sequence[str] = (),
        remove: bool | str = False,
        retention: timedelta | float = timedelta(days=7),
        keep: int = retention.DEFAULT_KEEP,
        abandon_after: timedelta | float = timedelta(hours=6),
        expire_after: timedelta | float | None = None,
        keep_versions: int = DEFAULT_KEEP_NEWEST,
        keep_version_days: float = DEFAULT_KEEP_DAYS,
        cos_conn_id: str = "cos_default",
        mlflow_conn_id: str = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dataset_uris = dataset_uris
        self.model_names = model_names
        self.remove = remove
        self.policy = _policy(
            retention,
            keep,
            abandon_after,
            VersionPolicy(keep_versions, keep_version_days),
            None if expire_after is None else as_seconds(expire_after),
        )  # checked when the DAG is parsed
        self.cos_conn_id = cos_conn_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from emr_ray.housekeeping import housekeep

        uris = [self.dataset_uris] if isinstance(self.dataset_uris, str) else list(self.dataset_uris)
        models = [self.model_names] if isinstance(self.model_names, str) else list(self.model_names)
        report = housekeep(
            uris,
            models,
            cos_conn_id=self.cos_conn_id,
            mlflow_conn_id=self.mlflow_conn_id,
            policy=self.policy,
            dry_run=not as_bool(self.remove),
        )
        if report.problems:  # what needs no registry was removed; committed data stayed
            raise RegistryIncompleteError(
                "No committed data was removed: the registry's answer was not complete: "
                + "; ".join(report.problems)
            )
        if report.failed:  # the rest was removed; a retry removes what is left
            raise RuntimeError(f"Could not remove {len(report.failed)} item(s): {report.as_xcom()['failed']}")
        return report.as_xcom()


def _policy(
    retain: timedelta | float,
    keep: int,
    abandon_after: timedelta | float,
    versions: VersionPolicy,
    expire_after_s: float | None,
) -> retention.Policy:
    return retention.Policy(
        keep=int(keep),
        retain_s=as_seconds(retain),
        abandon_after_s=as_seconds(abandon_after),
        versions=versions,
        expire_after_s=expire_after_s,
    )
