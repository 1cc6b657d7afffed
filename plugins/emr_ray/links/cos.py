"""Extra link "COS Console": the bucket folder a task read or wrote, in Tencent Cloud's COS console.

The task knows the bucket, region and prefix only at runtime (the keys are templated, the region
comes from the connection), so it stores the whole URL with :meth:`COSObjectLink.persist` under the
link's XCom key; Airflow 3 reads it back from there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

CONSOLE_URL = "https://console.cloud.tencent.com/cos/bucket"


class COSObjectLink(BaseOperatorLink):
    """Links a task to the COS console folder of the objects it waited for or transferred."""

    name = "COS Console"

    @staticmethod
    def url(bucket: str, region: str, prefix: str = "") -> str:
        """The console page of ``prefix`` (a folder: ends with ``/``, or empty for the bucket root).

        :param bucket: the bucket, with its ``-APPID`` suffix.
        :param region: the bucket's region, e.g. ``ap-guangzhou``.
        :param prefix: the folder inside the bucket.
        """
        return (
            f"{CONSOLE_URL}?bucket={quote(bucket, safe='')}&region={quote(region, safe='')}"
            f"&path={quote(prefix, safe='/')}"
        )

    @staticmethod
    def folder_of(keys: list[str]) -> str:
        """The deepest folder (ending in ``/``) holding every key; empty for the bucket root."""
        common = os.path.commonprefix(keys) if keys else ""
        return common[: common.rfind("/") + 1]

    @classmethod
    def persist(cls, context: Any, *, bucket: str, region: str, prefix: str = "") -> str | None:
        """Store the console URL on the running task instance; returns it (None outside a task run).

        :param context: the task's execution context.
        :param bucket: the bucket.
        :param region: the bucket's region.
        :param prefix: the folder to open.
        """
        ti = context.get("ti") if context else None
        if ti is None:
            return None
        link = cls.url(bucket, region, prefix)
        ti.xcom_push(key=cls().xcom_key, value=link)
        return link

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return str(value) if value else ""
