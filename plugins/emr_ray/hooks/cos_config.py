"""What a ``cos`` connection says: its fields read, checked and kept apart from the secrets.

It exists so that a wrong connection fails at once, before any request, with a message that names
the connection, the field and the fix (a missing ``region`` would otherwise become requests to
``cos.None.myqcloud.com``), and so the SecretKey and token never show in a ``repr``. Reading the
fields is pure: :class:`~emr_ray.hooks.cos.COSHook` looks the connection up and masks the secrets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emr_ray.exceptions import COSError


@dataclass(frozen=True)
class COSConnectionConfig:
    """What a ``cos`` connection says, validated on construction; the secrets never appear in its repr."""

    conn_id: str
    region: str
    secret_id: str | None
    secret_key: str | None = field(repr=False)
    token: str | None = field(default=None, repr=False)
    bucket: str | None = None
    scheme: str = "https"
    endpoint: str | None = None
    timeout: int = 60

    def __post_init__(self) -> None:
        if not self.region:
            raise COSError(
                f"Connection {self.conn_id!r} has no 'region' in its extra: add the bucket's region, "
                'e.g. {"region": "ap-guangzhou"}. An \'endpoint\' does not replace it: COS signs every '
                "request for the region's host name."
            )
        if self.scheme not in ("http", "https"):
            raise COSError(
                f"Connection {self.conn_id!r} has scheme {self.scheme!r}: use 'https' (or 'http' for a "
                "local endpoint)."
            )
        if bool(self.secret_id) != bool(self.secret_key):
            raise COSError(
                f"Connection {self.conn_id!r} has a SecretId without a SecretKey or the reverse: set both "
                "login (SecretId) and password (SecretKey)."
            )
        if self.endpoint is not None:
            host, _, port = self.endpoint.rpartition(":") if ":" in self.endpoint else (self.endpoint, "", "")
            if not host or (port and not port.isdigit()):
                raise COSError(
                    f"Connection {self.conn_id!r} has endpoint {self.endpoint!r}: use 'host' or 'host:port', "
                    "e.g. '127.0.0.1:9000'."
                )

    @classmethod
    def from_connection(
        cls, conn_id: str, *, login: str | None, password: str | None, extra: dict[str, Any]
    ) -> COSConnectionConfig:
        """The settings of a ``cos`` connection's fields; an ``endpoint`` given as a URL
        (``http://host:port/``) also sets the scheme, unless ``scheme`` is set.

        :raises COSError: when a field is missing or malformed (the message names it and the fix).
        """
        endpoint = extra.get("endpoint") or None
        scheme = extra.get("scheme") or None
        if endpoint and "://" in endpoint:
            endpoint_scheme, endpoint = endpoint.split("://", 1)
            scheme = scheme or endpoint_scheme
            endpoint = endpoint.rstrip("/")
        return cls(
            conn_id=conn_id,
            region=extra.get("region") or "",
            secret_id=login or None,
            secret_key=password or None,
            token=extra.get("token") or None,
            bucket=extra.get("bucket") or None,
            scheme=scheme or "https",
            endpoint=endpoint,
            timeout=int(extra.get("timeout") or 60),
        )

    @property
    def endpoint_host_port(self) -> tuple[str, int | None]:
        """The endpoint split into host and port (port None: the scheme's default)."""
        if self.endpoint is None:
            raise COSError(f"Connection {self.conn_id!r} has no 'endpoint' extra.")
        if ":" in self.endpoint:
            host, port = self.endpoint.rsplit(":", 1)
            return host, int(port)
        return self.endpoint, None
