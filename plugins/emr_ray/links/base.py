"""One way for every extra link: the task stores the whole URL in XCom, Airflow reads it back.

The Ray job page, the MLflow run and model version and the COS console folder are known only while
the task runs (a submission id, a run id, a templated key), so each operator builds its URL then and
calls :meth:`XComStoredLink.persist`; Airflow 3 reads the link back with :meth:`XComStoredLink.get_link`
from the link's own XCom key, on the API server and on the worker when the task ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class XComStoredLink(BaseOperatorLink):
    """A link whose whole URL the running task stored under the link's XCom key; empty until then."""

    @classmethod
    def persist(cls, context: Any, url: str | None) -> str | None:
        """Store ``url`` for this link on the running task instance; returns what was stored.

        Stored even when ``url`` is None (as an empty link): Airflow reads every link back when the
        task ends and logs a missing one as an error. Outside a task run (no ``ti`` in ``context``)
        nothing is stored and None is returned.

        :param context: the task's execution context.
        :param url: the page to link to, or None when there is none.
        """
        ti = context.get("ti") if context else None
        if ti is None:
            return None
        link = url or ""
        ti.xcom_push(key=cls().xcom_key, value=link)
        return link

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return str(value) if value else ""
