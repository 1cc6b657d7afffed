"""Extra link "COS Console": the bucket folder a task read or wrote, in Tencent Cloud's COS console.

The task knows the bucket, region and prefix only at runtime (the keys are templated, the region
comes from the connection), so it builds the URL with :meth:`COSObjectLink.url` and stores it with
:meth:`~emr_ray.links.base.XComStoredLink.persist`.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from emr_ray.links.base import XComStoredLink

CONSOLE_URL = "https://console.cloud.tencent.com/cos/bucket"


class COSObjectLink(XComStoredLink):
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
