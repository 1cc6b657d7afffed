"""Extra link "Ray Dashboard": the job page of the Ray job a task ran (stored in XCom at submit time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class RayJobLink(BaseOperatorLink):
    """Links a task to its Ray job in the dashboard."""

    name = "Ray Dashboard"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""

    @classmethod
    def persist(cls, context, url: str) -> None:
        context["ti"].xcom_push(key=cls().xcom_key, value=url)
