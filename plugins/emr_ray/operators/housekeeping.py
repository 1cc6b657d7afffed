"""Housekeeping of produced partitions as a task: :class:`PartitionHousekeepingOperator`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from emr_ray.cluster import retention
from emr_ray.templating import as_bool, as_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context


class PartitionHousekeepingOperator(BaseOperator):
    """
    Remove what no one needs from the partitions of some datasets, by the rules of
    :mod:`emr_ray.cluster.retention`: never the newest ``keep`` commits, never a generation superseded
    less than ``retention`` ago, never one that a live version of ``model_names`` or a pin names;
    uncommitted generations once their writer was inactive for ``abandon_after``. A training's pin is
    released once no live model version came from its run. **A dry run unless** ``remove``: the log and
    the XCom say what would go and why (``planned``, ``by_kind``, ``removed``, ``failed``).

    The same pass runs from a shell: ``python -m emr_ray.housekeeping sweep ...`` (:mod:`emr_ray.housekeeping`).

    :param dataset_uris: dataset folders holding ``dt=...`` partitions (templated).
    :param model_names: registered models whose live versions keep their data (templated).
    :param remove: remove what the rules allow; False (default): only say what would be removed
        (templated: ``"{{ not params.dry_run }}"`` works).
    :param retention: how long a superseded generation stays at least (timedelta or seconds; 7 days).
    :param keep: committed generations always kept per partition (3).
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
        cos_conn_id: str = "cos_default",
        mlflow_conn_id: str = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dataset_uris = dataset_uris
        self.model_names = model_names
        self.remove = remove
        self.policy = _policy(retention, keep, abandon_after)  # checked when the DAG is parsed
        self.cos_conn_id = cos_conn_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from emr_ray.housekeeping import housekeep

        uris = [self.dataset_uris] if isinstance(self.dataset_uris, str) else list(self.dataset_uris)
        models = [self.model_names] if isinstance(self.model_names, str) else list(self.model_names)
        report = housekeep(uris, models, cos_conn_id=self.cos_conn_id, mlflow_conn_id=self.mlflow_conn_id,
                           policy=self.policy, dry_run=not as_bool(self.remove))  # fmt: skip
        if report.failed:  # the rest was removed; a retry removes what is left
            raise RuntimeError(f"Could not remove {len(report.failed)} item(s): {report.as_xcom()['failed']}")
        return report.as_xcom()


def _policy(retain: timedelta | float, keep: int, abandon_after: timedelta | float) -> retention.Policy:
    return retention.Policy(
        keep=int(keep), retain_s=as_seconds(retain), abandon_after_s=as_seconds(abandon_after)
    )
