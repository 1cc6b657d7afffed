"""WebHdfsSettingsHook: the Apache HDFS provider's ``webhdfs`` connection as this provider's storage settings.

The cluster-side jobs open ``hdfs://`` through the NameNode's WebHDFS endpoint; this hook turns the
connection (host and port of that endpoint, login = the HDFS user, extra ``use_ssl`` and
``spark_over_webhdfs``) into the job spec's ``storage.hdfs`` section. None of it is secret.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from emr_ray.cluster import storage


class WebHdfsSettingsHook(BaseHook):
    """Reads a ``webhdfs`` connection (the Apache HDFS provider's type) for the Ray job operators.

    :param webhdfs_conn_id: the connection; None means the NameNode's host on the default port.
    """

    conn_name_attr = "webhdfs_conn_id"
    default_conn_name = "webhdfs_default"
    conn_type = "webhdfs"

    def __init__(self, webhdfs_conn_id: str | None = None) -> None:
        super().__init__()
        self.webhdfs_conn_id = webhdfs_conn_id

    def storage_settings(self) -> dict[str, Any]:
        """The spec's ``storage.hdfs`` section (no secrets in it)."""
        if not self.webhdfs_conn_id:
            return storage.StorageOptions().hdfs_public()
        conn = self.get_connection(self.webhdfs_conn_id)
        if conn.conn_type != "webhdfs":
            raise ValueError(
                f"Connection {self.webhdfs_conn_id!r} has type {conn.conn_type!r}; hdfs_conn_id needs a "
                "'webhdfs' connection (host and port of the NameNode's WebHDFS endpoint, login = user)."
            )
        if not conn.host:
            raise ValueError(
                f"Connection {self.webhdfs_conn_id!r} has no host; set the NameNode's host name."
            )
        extra = conn.extra_dejson
        https = str(extra.get("use_ssl", False)).lower() == "true"
        host = conn.host.split(",")[0].strip()  # the provider's hook takes a list of NameNodes
        port = conn.port or storage.default_webhdfs_port(https)
        return storage.StorageOptions(
            webhdfs_address=f"{'https' if https else 'http'}://{host}:{port}",
            hdfs_user=conn.login or None,
            hdfs_over_webhdfs=str(extra.get("spark_over_webhdfs", False)).lower() == "true",
        ).hdfs_public()
