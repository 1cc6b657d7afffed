"""Extra links from a task to the MLflow UI: the source run and the registered model version.

The operator computes each URL while it runs (only it knows the run and the version) and stores it
with :meth:`MLflowLink.persist` under the link's XCom key; Airflow 3 reads the link back from that
key on the API server, and ``get_link`` returns it on the worker when the task finishes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class MLflowLink(BaseOperatorLink):
    """A link whose whole URL was stored in XCom by the operator; empty until then."""

    name = "MLflow"

    @classmethod
    def persist(cls, context: Any, url: str | None) -> None:
        """
        Store ``url`` for this link on the running task instance (an empty link when ``url`` is empty).

        Stored either way: Airflow reads every link back when the task ends and logs a missing one
        as an error.

        :param context: the task's execution context.
        :param url: the page to link to, or None when MLflow has no UI URL.
        """
        context["ti"].xcom_push(key=cls().xcom_key, value=url or "")

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return str(value) if value else ""


class MLflowRunLink(MLflowLink):
    """The MLflow run a model was registered from."""

    name = "MLflow Run"


class MLflowModelVersionLink(MLflowLink):
    """The registered model version the task created or reused."""

    name = "MLflow Model Version"
