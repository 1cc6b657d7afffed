"""What a job needs to reach its storage, read from the Airflow connections once per task: the
spec's public part for the URIs it names (endpoint, region; never a key), the job's secret
environment (the COS keys, staged apart from the spec), and the full options the Airflow side uses
to look at the data itself (a partition's listing, a committed generation; never logged or sent)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from emr_ray.cluster.spec import COS_SECRET_ENV


@dataclass
class StorageConnections:
    """The ``cos`` and ``webhdfs`` connections of one task."""

    cos_conn_id: str = "cos_default"
    hdfs_conn_id: str | None = None

    @cached_property
    def _cos(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The COS connection split into the spec's public part and the job's secret env vars."""
        from emr_ray.cluster.storage import StorageOptions
        from emr_ray.hooks.cos import COSHook

        options = StorageOptions(**COSHook(self.cos_conn_id).pyarrow_s3_options())
        secrets = {env: getattr(options, key) for key, env in COS_SECRET_ENV.items() if getattr(options, key)}
        return options.public(), secrets

    def _hdfs(self) -> dict[str, Any]:
        from emr_ray.hooks.hdfs import WebHdfsSettingsHook

        return WebHdfsSettingsHook(self.hdfs_conn_id).storage_settings()

    def for_spec(self, spec_text: str) -> dict[str, Any]:
        """The spec's ``storage`` section for the schemes its JSON names: public settings only."""
        section: dict[str, Any] = {}
        if "cos://" in spec_text:
            section["cos"] = self._cos[0]
        if "hdfs://" in spec_text:
            section["hdfs"] = self._hdfs()
        return section

    def cos_secrets(self) -> dict[str, str]:
        """The COS keys as the job's secret environment variables (name -> value)."""
        return dict(self._cos[1])

    def options_for(self, uri: str) -> Any:
        """The full storage options for ``uri`` on the Airflow side (COS keys included: never log or
        send them); None for ``file://``."""
        from emr_ray.cluster import storage

        scheme = storage.split_uri(uri)[0]
        if scheme == "cos":
            public, secrets = self._cos
            keys: dict[str, Any] = {key: secrets.get(env) for key, env in COS_SECRET_ENV.items()}
            return storage.StorageOptions(**public, **keys)
        if scheme == "hdfs":
            return storage.StorageOptions(**self._hdfs())
        return None
