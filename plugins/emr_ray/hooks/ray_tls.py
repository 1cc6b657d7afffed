"""TLS and address rules of the ``ray`` connection: one SSL context for the sync and async clients.

The extras, read by :meth:`RayTlsConfig.from_extra` (pure; :class:`~emr_ray.hooks.ray.RayHook`
calls it and builds both its clients from :meth:`RayTlsConfig.ssl_context`):

- ``verify`` (default true): check the dashboard's certificate and its name. ``false`` turns the
  check off (the hook logs a warning): anyone on the network path could read the token.
- ``ca_bundle``: path to a PEM file (or a directory of hashed CA files) with the CA(s) to trust;
- ``ca_pem``: the same as text, the PEM itself pasted into the connection (handy where the
  connection comes from a secrets backend and no file can be shipped). Both may be given. When
  either is given, only these CAs are trusted (not the system or ``certifi`` bundle); otherwise the
  ``certifi`` bundle is (or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, as httpx reads them).
- ``client_cert`` / ``client_key``: paths to the PEM client certificate and its (unencrypted) key
  for mutual TLS; ``client_key`` may be left out when the certificate file holds the key too.
- ``allow_insecure_http`` (default false): allow the token over plain ``http://`` to another machine.
- ``uds``: path of a Unix socket to reach the dashboard through (the host then only names it).

The token never goes over plain http to another machine unless the connection says so
(:func:`refuse_plain_http`): loopback addresses (127.0.0.0/8, ::1, ``localhost``), a Unix socket
(``uds``) and an ``auto`` address of this machine (a head on this node) are allowed, and so is a connection with no
credentials (no token and no ``Authorization`` or ``Cookie`` header): it has nothing to leak.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from emr_ray.exceptions import RayConnectionConfigError

CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_PEM_CERT = "-----BEGIN CERTIFICATE-----"


def _flag(conn_id: str, extra: dict[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    hint = ' (a CA file goes in "ca_bundle")' if key == "verify" and isinstance(value, str) else ""
    raise RayConnectionConfigError(
        f"Connection {conn_id!r}: extra {key!r} is {value!r}; set it to true or false{hint}."
    )


def _path(conn_id: str, extra: dict[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra {key!r} is {value!r}; give the path of a PEM file."
        )
    if _PEM_CERT in value or "-----BEGIN" in value:
        inline = ' (inline PEM of a CA goes in "ca_pem")' if key == "ca_bundle" else ""
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra {key!r} holds PEM text; give the path of a PEM file{inline}."
        )
    return os.path.expanduser(value.strip())


@dataclass(frozen=True)
class RayTlsConfig:
    """The TLS and transport extras of a ``ray`` connection (see the module docstring)."""

    conn_id: str
    verify: bool = True
    ca_bundle: str | None = None
    ca_pem: str | None = field(default=None, repr=False)
    client_cert: str | None = None
    client_key: str | None = None
    allow_insecure_http: bool = False
    uds: str | None = None

    @classmethod
    def from_extra(cls, conn_id: str, extra: dict[str, Any]) -> RayTlsConfig:
        """Read and check the extras; a wrong type fails here, a missing file when the context is built."""
        ca_pem = extra.get("ca_pem") or None
        if ca_pem is not None:
            if not isinstance(ca_pem, str) or _PEM_CERT not in ca_pem:
                raise RayConnectionConfigError(
                    f"Connection {conn_id!r}: extra 'ca_pem' is not PEM text; paste the CA certificate(s) "
                    f"with their {_PEM_CERT} lines, or put a file path in 'ca_bundle'."
                )
            if "\n" not in ca_pem.strip() and "\\n" in ca_pem:  # pasted as one line with \n escapes
                ca_pem = ca_pem.replace("\\n", "\n")
        config = cls(
            conn_id=conn_id,
            verify=_flag(conn_id, extra, "verify", True),
            ca_bundle=_path(conn_id, extra, "ca_bundle"),
            ca_pem=ca_pem,
            client_cert=_path(conn_id, extra, "client_cert"),
            client_key=_path(conn_id, extra, "client_key"),
            allow_insecure_http=_flag(conn_id, extra, "allow_insecure_http", False),
            uds=_path(conn_id, extra, "uds"),
        )
        if config.client_key and not config.client_cert:
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra 'client_key' is set without 'client_cert'; add the client "
                "certificate's path, or remove the key."
            )
        return config

    def ssl_context(self) -> ssl.SSLContext:
        """The one SSL context both clients use (blocking: it reads files; call it off the event loop)."""
        if not self.verify:
            context = httpx.create_ssl_context(verify=False)
        elif self.ca_bundle or self.ca_pem:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._load_cas(context)
        else:
            context = httpx.create_ssl_context()  # certifi, or SSL_CERT_FILE / SSL_CERT_DIR
        if self.client_cert:
            for key in ("client_cert", "client_key"):
                path = getattr(self, key)
                if path and not os.path.isfile(path):
                    raise self._missing(key, path)
            try:
                context.load_cert_chain(self.client_cert, self.client_key)
            except ssl.SSLError as e:
                raise RayConnectionConfigError(
                    f"Connection {self.conn_id!r}: the client certificate {self.client_cert} (key "
                    f"{self.client_key or 'in the same file'}) could not be loaded ({e}); give PEM files, "
                    "the key unencrypted and matching the certificate."
                ) from e
        return context

    def _load_cas(self, context: ssl.SSLContext) -> None:
        if self.ca_bundle:
            if not os.path.exists(self.ca_bundle):
                raise self._missing("ca_bundle", self.ca_bundle)
            is_dir = os.path.isdir(self.ca_bundle)
            try:
                context.load_verify_locations(
                    capath=self.ca_bundle if is_dir else None, cafile=None if is_dir else self.ca_bundle
                )
            except ssl.SSLError as e:
                raise RayConnectionConfigError(
                    f"Connection {self.conn_id!r}: extra 'ca_bundle' ({self.ca_bundle}) holds no readable "
                    f"CA certificate ({e}); give a PEM file with {_PEM_CERT} blocks."
                ) from e
        if self.ca_pem:
            try:
                context.load_verify_locations(cadata=self.ca_pem)
            except ssl.SSLError as e:
                raise RayConnectionConfigError(
                    f"Connection {self.conn_id!r}: extra 'ca_pem' could not be read as CA certificates "
                    f"({e}); paste the whole PEM, {_PEM_CERT} to -----END CERTIFICATE-----."
                ) from e

    def _missing(self, key: str, path: str) -> RayConnectionConfigError:
        return RayConnectionConfigError(
            f"Connection {self.conn_id!r}: extra {key!r} names {path}, which does not exist on this machine "
            "(the Airflow worker or triggerer); ship the file there or fix the path."
        )


def is_this_machine(host: str | None) -> bool:
    """Whether ``host`` is an address of one of this machine's interfaces (a socket can bind to it)."""
    import socket

    if not host:
        return False
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host.strip("[]"), 0))
        return True
    except OSError:
        return False


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine: 127.0.0.0/8, ::1 (also IPv4-mapped) or ``localhost``."""
    if not host:
        return False
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def has_credentials(token: str | None, headers: dict[str, str]) -> bool:
    """Whether requests carry a secret: the token, or an ``Authorization`` / ``Cookie`` header."""
    return bool(token) or any(name.lower() in CREDENTIAL_HEADERS for name in headers)


def refuse_plain_http(url: str, tls: RayTlsConfig, *, credentials: bool, auto: bool) -> str | None:
    """:func:`plain_http_verdict` for the ``ray`` connection's token. Also allowed: no credentials, a
    Unix socket (``uds``), and an ``auto`` address that is one of this machine's own (a head on this
    node); ``auto`` on a worker node finds the cluster's head on another machine, which is refused
    like any other."""
    if not credentials or tls.uds:
        return None
    https = url.replace("http://", "https://", 1)
    return plain_http_verdict(
        url,
        conn_id=tls.conn_id,
        secret="auth token",
        allowed=tls.allow_insecure_http,
        error=RayConnectionConfigError,
        this_machine=auto,
        fix=f'Put the dashboard behind TLS and set the host to {https} (extra "ca_bundle" or "ca_pem" for a private CA)',
    )


def plain_http_verdict(
    url: str,
    *,
    conn_id: str,
    secret: str,
    allowed: bool,
    fix: str,
    error: type[Exception],
    this_machine: bool = False,
) -> str | None:
    """The one rule for a connection's ``secret`` (a token, a login) and plain http, for every
    connection that sends one (``ray``, ``mlflow``): https and loopback hosts are fine (None), and so
    is, with ``this_machine``, an address of one of this machine's interfaces; another machine over
    plain http raises ``error`` saying ``fix``, unless the connection's extra ``allow_insecure_http``
    is set (``allowed``): then the warning to log. ``url`` must hold no userinfo (it is shown)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or is_loopback(parts.hostname):
        return None
    if this_machine and is_this_machine(parts.hostname):
        return None
    if allowed:
        return (
            f"Connection {conn_id!r} sends its {secret} over plain http to {url} "
            "(allow_insecure_http is set): anyone on the network path can read it; prefer https."
        )
    raise error(
        f"Connection {conn_id!r} would send its {secret} over plain http to {url}, which is not this "
        f"machine: anyone on the network path could read it. {fix}, or, on a network you trust, set the "
        'connection\'s extra "allow_insecure_http": true.'
    )


def describe_tls_failure(error: BaseException, *, conn_id: str, url: str) -> str | None:
    """A message that says what to fix for a TLS failure of a call to ``url``; None if it is not one."""
    text = str(error)
    upper = text.upper()
    if "CERTIFICATE_VERIFY_FAILED" in upper:
        if "MISMATCH" in upper:
            return (
                f"The TLS certificate of {url} is not valid for that address ({text}). Set the host of "
                f"connection {conn_id!r} to a name or IP address the certificate lists (its "
                "subjectAltName), or reissue the certificate for this address."
            )
        return (
            f"The TLS certificate of {url} is not trusted ({text}). Give connection {conn_id!r} the CA "
            'that signed it: extra "ca_bundle" (path to a PEM file) or "ca_pem" (the PEM text). '
            '"verify": false skips the check, for tests only: the token is then open to interception.'
        )
    if "CERTIFICATE_REQUIRED" in upper:
        return (
            f"The server at {url} asks for a client certificate (mutual TLS) ({text}): set the extras "
            f'"client_cert" and "client_key" of connection {conn_id!r} to the PEM files it accepts.'
        )
    if "UNKNOWN_CA" in upper or "BAD_CERTIFICATE" in upper or "CERTIFICATE_UNKNOWN" in upper:
        return (
            f"The server at {url} rejected the client certificate of connection {conn_id!r} ({text}): "
            'set "client_cert" / "client_key" to a certificate signed by a CA the server trusts.'
        )
    if (
        "WRONG_VERSION_NUMBER" in upper
        or "RECORD_LAYER_FAILURE" in upper
        or "PACKET_LENGTH_TOO_LONG" in upper
    ):
        return (
            f"{url} does not answer TLS ({text}): the dashboard there speaks plain http. Put it behind a "
            f"TLS proxy, or, for a head on this machine, set the host of connection {conn_id!r} to http://."
        )
    if "[SSL" in upper:
        return f"The TLS handshake with {url} failed ({text}); check connection {conn_id!r}'s TLS extras."
    return None
