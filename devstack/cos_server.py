"""A COS-protocol stand-in on 127.0.0.1: moto's S3 backend behind a small WSGI adapter.

Used by the tests and by ``make demo``'s embedded default, so both talk to COS exactly as production
does: cos-python-sdk-v5 configured with ``IP``/``Port`` keeps the production Host header
``<bucket>.cos.<region>.myqcloud.com`` and signs with COS's ``q-sign-algorithm=sha1`` scheme, while
pyarrow's ``S3FileSystem(endpoint_override="127.0.0.1:N", scheme="http")`` reaches the same objects
path-style with SigV4 (Spark and Ray jobs read through pyarrow).

moto's own server answers COS-signed requests with HTTP 500 (it parses the COS Authorization header
as SigV4), sends lower-case response headers and error XML that the SDK cannot parse. The adapter,
:class:`CosWsgiAdapter`, fixes exactly that and nothing more:

* **Host**: a virtual-host request (``<bucket>.cos.<region>.myqcloud.com``) becomes path style
  (``/<bucket>/<key>``) on ``127.0.0.1``;
* **auth**: the COS Authorization header is checked (rejected SecretIds, and signatures of SecretIds
  registered with their SecretKey) and then removed, so moto treats the request as unsigned;
* **headers**: ``x-cos-*`` request headers become ``x-amz-*``; on COS requests ``x-amz-*`` response
  headers become ``x-cos-*``; all response header names get canonical casing (``Last-Modified``,
  ``ETag``); ``x-cos-copy-source`` in COS's ``<bucket>.cos.<region>.myqcloud.com/<key>`` form
  becomes S3's ``<bucket>/<key>``;
* **errors**: the error XML gains ``<Resource>``, ``<RequestId>`` and ``<TraceId>`` (the SDK's error
  parser needs all of them, else every error code reads ``Unknown``);
* **multipart**: COS's 1 MB minimum part size instead of S3's 5 MB.

moto keeps its data in process-global memory: every stand-in in one process shares the same buckets.
Nothing is written to disk. moto is imported lazily, so this module imports without it.

Run it alone (the demo starts it this way, as a subprocess)::

    python -m devstack.cos_server --port 0 --bucket demo-1250000000 --port-file .state/cos.port
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit
from xml.sax.saxutils import escape

log = logging.getLogger(__name__)

#: COS's smallest multipart part (all parts but the last), in bytes.
COS_MIN_PART_SIZE = 1024 * 1024
#: the injected "fault" that answers a listing with a well-formed empty one
EMPTY_LISTING = "EmptyListing"

_COS_VHOST = re.compile(
    r"^(?P<bucket>[a-z0-9][a-z0-9.-]*)\.cos\.(?P<region>[a-z0-9-]+)\.myqcloud\.com(:\d+)?$"
)
_COS_SERVICE_HOST = re.compile(r"^(service\.cos|cos\.[a-z0-9-]+)\.myqcloud\.com(:\d+)?$")
_SIGV4_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
_SPECIAL_HEADER_CASE = {"etag": "ETag", "content-md5": "Content-MD5", "www-authenticate": "WWW-Authenticate"}

StartResponse = Callable[..., Any]


def canonical_header_name(name: str) -> str:
    """``last-modified`` -> ``Last-Modified``; ``x-cos-*`` / ``x-amz-*`` stay lower case as COS sends them."""
    low = name.lower()
    if low.startswith(("x-cos-", "x-amz-")):
        return low
    return _SPECIAL_HEADER_CASE.get(low) or "-".join(part.capitalize() for part in low.split("-"))


def _parse_cos_authorization(value: str) -> dict[str, str]:
    """Split ``q-sign-algorithm=sha1&q-ak=...&q-signature=...`` into a dict."""
    return dict(part.split("=", 1) for part in value.split("&") if "=" in part)


def cos_signature(
    *,
    secret_key: str,
    method: str,
    path: str,
    params: dict[str, str],
    headers: dict[str, str],
    key_time: str,
) -> str:
    """COS's request signature (``q-sign-algorithm=sha1``), as cos-python-sdk-v5 computes it.

    :param path: the unquoted request path relative to the bucket, e.g. ``/raw/a b.txt``.
    :param params: the signed query parameters (names as sent).
    :param headers: the signed headers (names as sent).
    """

    def encode(items: dict[str, str]) -> str:
        pairs = {quote(k, "-_.~").lower(): quote(v, "-_.~") for k, v in items.items()}
        return "&".join(f"{k}={v}" for k, v in sorted(pairs.items()))

    http_string = f"{method.lower()}\n{path}\n{encode(params)}\n{encode(headers)}\n"
    string_to_sign = f"sha1\n{key_time}\n{hashlib.sha1(http_string.encode()).hexdigest()}\n"
    sign_key = hmac.new(secret_key.encode(), key_time.encode(), hashlib.sha1).hexdigest()
    return hmac.new(sign_key.encode(), string_to_sign.encode(), hashlib.sha1).hexdigest()


def _environ_header(environ: dict[str, Any], name: str) -> str | None:
    key = name.upper().replace("-", "_")
    if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        return environ.get(key)
    return environ.get(f"HTTP_{key}")


class CosWsgiAdapter:
    """WSGI middleware that lets moto's S3 app answer cos-python-sdk-v5 (and still pyarrow's SigV4).

    :param app: moto's S3 WSGI app (``create_backend_app("s3")``).
    :param rejected_secret_ids: SecretIds answered with 403 ``InvalidAccessKeyId``.
    :param credentials: SecretId -> SecretKey; COS signatures by these SecretIds are verified and a
        wrong one is answered with 403 ``SignatureDoesNotMatch``. Other SecretIds are not checked.
    """

    def __init__(
        self,
        app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
        *,
        rejected_secret_ids: set[str] | None = None,
        credentials: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.rejected_secret_ids = rejected_secret_ids if rejected_secret_ids is not None else set()
        self.credentials = credentials if credentials is not None else {}
        #: (status, code) answered to the next requests instead of forwarding them, to test retries
        self.faults: list[tuple[int, str]] = []
        #: seconds the next requests wait before they are served, to test slow responses
        self.delays: list[float] = []
        #: (method, text in the path or query, status, code): answered to the next requests that match
        self.targeted: list[tuple[str, str, int, str]] = []
        #: requests answered so far (faulted ones included), to pace fault bursts by the client's progress
        self.requests = 0
        self._faults_lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST", "")
        vhost = _COS_VHOST.match(host)
        authorization = environ.get("HTTP_AUTHORIZATION", "")
        query = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        cos_auth = _parse_cos_authorization(authorization) if authorization.startswith("q-sign") else {}
        if not cos_auth and "q-ak" in query:  # a presigned COS URL
            cos_auth = {k: v for k, v in query.items() if k.startswith("q-")}
        is_cos = bool(vhost or cos_auth or _COS_SERVICE_HOST.match(host))
        request_path = unquote(environ.get("RAW_URI", "").split("?", 1)[0] or environ.get("PATH_INFO", "/"))
        if vhost:
            resource = f"{host.split(':')[0]}{request_path}"
        else:
            resource = request_path

        secret_id = cos_auth.get("q-ak")
        if secret_id is None:
            match = _SIGV4_CREDENTIAL.search(authorization) or _SIGV4_CREDENTIAL.search(
                "Credential=" + query.get("X-Amz-Credential", "")
            )
            secret_id = match.group(1) if match else None
        target = f"{request_path}?{environ.get('QUERY_STRING', '')}"
        with self._faults_lock:
            self.requests += 1
            fault = self.faults.pop(0) if self.faults else None
            delay = self.delays.pop(0) if self.delays else 0.0
            for i, (method, text, *_) in enumerate(self.targeted):
                if fault is None and environ.get("REQUEST_METHOD") == method and text in unquote(target):
                    fault = self.targeted.pop(i)[2:]
                    break
        if delay:
            time.sleep(delay)
        if fault is not None:
            status, code = fault
            if code == EMPTY_LISTING:
                return self._empty_listing(start_response, resource)
            return self._error(start_response, is_cos, status, code, "Injected fault.", resource)
        if secret_id is not None and secret_id in self.rejected_secret_ids:
            return self._error(
                start_response,
                is_cos,
                403,
                "InvalidAccessKeyId",
                "The Access Key Id you provided does not exist in our records.",
                resource,
            )
        if cos_auth and secret_id in self.credentials:
            if not self._signature_ok(environ, cos_auth, query, request_path, self.credentials[secret_id]):
                return self._error(
                    start_response,
                    is_cos,
                    403,
                    "SignatureDoesNotMatch",
                    "The calculated signature does not match the provided one.",
                    resource,
                )

        if is_cos:
            self._rewrite_request(environ, vhost, bool(cos_auth), secret_id)
        return self._forward(
            environ, start_response, is_cos, resource, vhost.group("region") if vhost else None
        )

    @staticmethod
    def _signature_ok(
        environ: dict[str, Any], auth: dict[str, str], query: dict[str, str], path: str, secret_key: str
    ) -> bool:
        header_names = [h for h in auth.get("q-header-list", "").split(";") if h]
        param_names = [p for p in auth.get("q-url-param-list", "").split(";") if p]
        headers = {name: _environ_header(environ, unquote(name)) or "" for name in header_names}
        lowered_query = {k.lower(): v for k, v in query.items()}
        params = {name: lowered_query.get(unquote(name), "") for name in param_names}
        expected = cos_signature(
            secret_key=secret_key,
            method=environ.get("REQUEST_METHOD", "GET"),
            path=path,
            params=params,
            headers=headers,
            key_time=auth.get("q-key-time", ""),
        )
        return hmac.compare_digest(expected, auth.get("q-signature", ""))

    @staticmethod
    def _rewrite_request(
        environ: dict[str, Any], vhost: re.Match[str] | None, signed: bool, secret_id: str | None
    ) -> None:
        """Turn a COS request into the unsigned, path-style S3 request moto understands."""
        if vhost:
            prefix = "/" + vhost.group("bucket")
            environ["PATH_INFO"] = prefix + environ.get("PATH_INFO", "/")
            for key in ("RAW_URI", "REQUEST_URI"):
                if environ.get(key):
                    environ[key] = prefix + environ[key]
        # an IP host makes moto read the bucket from the path
        environ["HTTP_HOST"] = f"127.0.0.1:{environ.get('SERVER_PORT', '80')}"
        if signed:
            # moto parses any Authorization as SigV4 (COS's answers HTTP 500) and treats a request
            # without one as anonymous (403 on private objects): send a SigV4-shaped stand-in. With
            # moto's default INITIAL_NO_AUTH_ACTION_COUNT the signature itself is never checked.
            environ["HTTP_AUTHORIZATION"] = (
                f"AWS4-HMAC-SHA256 Credential={secret_id or 'cos'}/20200101/us-east-1/s3/aws4_request, "
                "SignedHeaders=host, Signature=0"
            )
        for key in [k for k in environ if k.startswith("HTTP_X_COS_")]:
            environ["HTTP_X_AMZ_" + key[len("HTTP_X_COS_") :]] = environ.pop(key)
        copy_source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
        if copy_source:
            source = urlsplit(copy_source if "://" in copy_source else "//" + copy_source)
            source_vhost = _COS_VHOST.match(source.netloc)
            if source_vhost:
                environ["HTTP_X_AMZ_COPY_SOURCE"] = f"{source_vhost.group('bucket')}{source.path}"
        preserved = environ.get("moto.preserved_header_names")
        if isinstance(preserved, dict):
            for key in [k for k in preserved if k.startswith("HTTP_X_COS_")]:
                name = preserved.pop(key)
                preserved["HTTP_X_AMZ_" + key[len("HTTP_X_COS_") :]] = "x-amz-" + name[len("x-cos-") :]

    def _forward(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        is_cos: bool,
        resource: str,
        vhost_region: str | None = None,
    ) -> Iterable[bytes]:
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            captured["status"], captured["headers"], captured["exc_info"] = status, headers, exc_info
            return lambda data: None  # moto never uses the legacy write() callable

        body_iter = self.app(environ, capture)
        status: str = captured["status"]
        headers = self._map_headers(captured["headers"], is_cos)
        if vhost_region:  # moto knows only AWS regions; COS answers with the bucket's own
            headers = [(k, vhost_region if k == "x-cos-bucket-region" else v) for k, v in headers]
        if is_cos and int(status.split()[0]) >= 400 and environ.get("REQUEST_METHOD") != "HEAD":
            try:
                body = b"".join(body_iter)
            finally:
                close = getattr(body_iter, "close", None)
                if close:
                    close()
            body = _complete_error_xml(body, resource, _header(headers, "x-cos-request-id"))
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
            start_response(status, headers, captured["exc_info"])
            return [body]
        start_response(status, headers, captured["exc_info"])
        return body_iter

    @staticmethod
    def _map_headers(headers: list[tuple[str, str]], is_cos: bool) -> list[tuple[str, str]]:
        mapped: list[tuple[str, str]] = []
        for name, value in headers:
            low = name.lower()
            if is_cos and low.startswith("x-amz-"):
                low = "x-cos-" + low[len("x-amz-") :]
            mapped.append((canonical_header_name(low), value))
        if is_cos and _header(mapped, "x-cos-request-id") is None:
            mapped.append(("x-cos-request-id", uuid.uuid4().hex))
        return mapped

    @staticmethod
    def _empty_listing(start_response: StartResponse, resource: str) -> Iterable[bytes]:
        """A well-formed listing with nothing in it (what an eventually consistent or glitching listing
        can answer)."""
        bucket = resource.strip("/").split("/")[0]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<ListBucketResult><Name>{escape(bucket)}</Name><Prefix></Prefix><Marker></Marker>"
            "<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>"
        ).encode()
        start_response("200 OK", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    @staticmethod
    def _error(
        start_response: StartResponse, is_cos: bool, status: int, code: str, message: str, resource: str
    ) -> Iterable[bytes]:
        request_id = uuid.uuid4().hex
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
            f"<TraceId>{request_id}</TraceId></Error>"
        ).encode()
        prefix = "x-cos-" if is_cos else "x-amz-"
        headers = [
            ("Content-Type", "application/xml"),
            ("Content-Length", str(len(body))),
            (f"{prefix}request-id", request_id),
        ]
        if is_cos:
            headers.append(("x-cos-trace-id", request_id))
        reason = {403: "Forbidden", 500: "Internal Server Error", 503: "Service Unavailable"}.get(
            status, "Error"
        )
        start_response(f"{status} {reason}", headers)
        return [body]


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _complete_error_xml(body: bytes, resource: str, request_id: str | None) -> bytes:
    """Add the ``<Resource>``, ``<RequestId>`` and ``<TraceId>`` elements the COS SDK's parser requires."""
    text = body.decode("utf-8", errors="replace")
    if "<Error>" not in text or "</Error>" not in text:
        return body
    request_id = request_id or uuid.uuid4().hex
    extra = ""
    if "<Resource>" not in text:
        extra += f"<Resource>{escape(resource)}</Resource>"
    if "<RequestId>" not in text:
        extra += f"<RequestId>{request_id}</RequestId>"
    if "<TraceId>" not in text:
        extra += f"<TraceId>{request_id}</TraceId>"
    return text.replace("</Error>", extra + "</Error>", 1).encode("utf-8")


def create_cos_app(
    *, rejected_secret_ids: set[str] | None = None, credentials: dict[str, str] | None = None
) -> CosWsgiAdapter:
    """moto's S3 WSGI app wrapped in :class:`CosWsgiAdapter`, with COS's 1 MB minimum part size."""
    from moto.moto_server.werkzeug_app import create_backend_app
    from moto.s3 import models as s3_models

    # moto reads this module global when it completes a multipart upload
    s3_models.S3_UPLOAD_PART_MIN_SIZE = COS_MIN_PART_SIZE  # type: ignore[attr-defined]
    return CosWsgiAdapter(
        create_backend_app("s3"), rejected_secret_ids=rejected_secret_ids, credentials=credentials
    )


class CosStandIn:
    """A threaded COS-protocol server on 127.0.0.1 for tests and the embedded demo.

    :param host: the address to bind; only loopback addresses are accepted.
    :param port: the port to bind; 0 picks a free one (read :attr:`port` after :meth:`start`).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"CosStandIn binds loopback only, got host={host!r}: use 127.0.0.1")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port
        self.rejected_secret_ids: set[str] = set()
        self.credentials: dict[str, str] = {}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """``host:port``, what a COS connection's ``endpoint`` extra and pyarrow's ``endpoint_override`` take."""
        return f"{self.host}:{self.port}"

    def start(self) -> CosStandIn:
        """Bind and serve in a daemon thread; returns self once the port is bound."""
        if self._server is not None:
            return self
        from moto.moto_server.werkzeug_app import MotoRequestHandler
        from werkzeug.serving import make_server

        class _QuietHandler(MotoRequestHandler):
            disable_nagle_algorithm = True  # no 40 ms wait for a delayed ACK on each kept-alive answer

            def log_request(self, code: Any = "-", size: Any = "-") -> None:
                log.debug("%s %s", self.requestline, code)

        app = create_cos_app(rejected_secret_ids=self.rejected_secret_ids, credentials=self.credentials)
        self._server = make_server(self.host, self.port, app, threaded=True, request_handler=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="cos-stand-in", daemon=True)
        self._thread.start()
        log.info("COS stand-in serving on %s", self.endpoint)
        return self

    def stop(self) -> None:
        """Stop serving and release the port (the objects stay in moto's process-global memory)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> CosStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def create_bucket(self, name: str) -> None:
        """Create a bucket (no error if this process already has it)."""
        if self._server is None:
            raise RuntimeError("CosStandIn.create_bucket() needs start() first")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(f"http://{self.endpoint}/{quote(name)}", method="PUT")
        try:
            opener.open(request, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: BucketAlreadyOwnedByYou
                raise

    def seed_objects(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Write objects straight into moto's backend (this process only), for tests that need thousands.

        A PUT through HTTP costs ~15 ms here; this skips HTTP and signing, so use it only to prepare data.
        """
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key, value in objects.items():
            backend.put_object(bucket, key, value)

    def reject_secret_id(self, secret_id: str) -> None:
        """Answer every request signed by ``secret_id`` with 403 ``InvalidAccessKeyId``, as COS does."""
        self.rejected_secret_ids.add(secret_id)

    def allow_secret_id(self, secret_id: str) -> None:
        """Undo :meth:`reject_secret_id`."""
        self.rejected_secret_ids.discard(secret_id)

    def inject_faults(self, count: int, status: int = 503, code: str = "SlowDown") -> None:
        """Answer the next ``count`` requests with ``status``/``code`` (throttling by default)."""
        if self._server is None:
            raise RuntimeError("CosStandIn.inject_faults() needs start() first")
        app: CosWsgiAdapter = self._server.app
        with app._faults_lock:
            app.faults.extend([(status, code)] * count)

    def inject_faults_on(
        self, method: str, text: str, count: int, status: int = 503, code: str = "SlowDown"
    ) -> None:
        """Answer the next ``count`` ``method`` requests whose path or query holds ``text`` with
        ``status``/``code``; other requests pass (a fault at one step of a protocol)."""
        if self._server is None:
            raise RuntimeError("CosStandIn.inject_faults_on() needs start() first")
        app: CosWsgiAdapter = self._server.app
        with app._faults_lock:
            app.targeted.extend([(method, text, status, code)] * count)

    def inject_empty_listings(self, count: int, text: str = "prefix=") -> None:
        """Answer the next ``count`` listings (GETs whose path or query holds ``text``) with a
        well-formed empty listing: the objects are there, the answer says none are."""
        self.inject_faults_on("GET", text, count, status=200, code=EMPTY_LISTING)

    def inject_delays(self, count: int, seconds: float) -> None:
        """Serve the next ``count`` requests ``seconds`` late (a slow, overloaded COS)."""
        if self._server is None:
            raise RuntimeError("CosStandIn.inject_delays() needs start() first")
        app: CosWsgiAdapter = self._server.app
        with app._faults_lock:
            app.delays.extend([seconds] * count)

    def unserved_faults(self) -> int:
        """How many injected faults and delays no request has met yet."""
        if self._server is None:
            return 0
        with self._server.app._faults_lock:
            app = self._server.app
            return len(app.faults) + len(app.delays) + len(app.targeted)

    def requests_seen(self) -> int:
        """How many requests the stand-in has answered (injected faults included)."""
        return self._server.app.requests if self._server is not None else 0

    def clear_faults(self) -> None:
        """Forget faults and delays not yet served."""
        if self._server is not None:
            with self._server.app._faults_lock:
                self._server.app.faults.clear()
                self._server.app.targeted.clear()
                self._server.app.delays.clear()

    def register_credentials(self, secret_id: str, secret_key: str) -> None:
        """Verify COS signatures by ``secret_id``: a wrong SecretKey gets 403 ``SignatureDoesNotMatch``."""
        self.credentials[secret_id] = secret_key


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM/SIGINT; write the bound port to ``--port-file`` once ready."""
    parser = argparse.ArgumentParser(prog="python -m devstack.cos_server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    parser.add_argument("--port-file", type=Path, help="file to write the bound port to once serving")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stand_in = CosStandIn(host=args.host, port=args.port).start()
    for bucket in args.bucket:
        stand_in.create_bucket(bucket)
    if args.port_file:
        args.port_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.port_file.with_suffix(args.port_file.suffix + ".tmp")
        tmp.write_text(str(stand_in.port))
        os.replace(tmp, args.port_file)  # readers never see a half-written file
    log.info("COS stand-in ready on %s, buckets: %s", stand_in.endpoint, ", ".join(args.bucket) or "none")

    stopped = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stopped.wait()
    stand_in.stop()
    if args.port_file:
        args.port_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
