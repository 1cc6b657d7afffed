"""A TLS-terminating proxy on 127.0.0.1 in front of a plain-http server (the Ray dashboard), and a
throwaway PKI for it.

The local Ray head serves its dashboard over plain http, as most clusters do behind a load balancer or
ingress that terminates TLS. This proxy plays that part for the tests: it accepts TLS on
``127.0.0.1:<port>`` with a given certificate and key (and, for mutual TLS, a CA that client
certificates must chain to), and forwards the bytes both ways to the upstream's ``host:port``. It
never reads or answers HTTP itself: every answer is the upstream's own.

    pki = make_local_pki(folder)        # CA, server certificate for 127.0.0.1 (IP SAN), client certificate
    with TlsProxy("http://127.0.0.1:8265", pki.server_cert, pki.server_key) as proxy:
        proxy.url                       # https://127.0.0.1:<port>; trust pki.ca_cert

It can also listen on a Unix socket (``uds=``), with or without TLS. By hand:
``python -m devstack.tls_proxy --upstream http://127.0.0.1:8265 --dir .state/tls``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import os
import ssl
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"
_CHUNK = 64 * 1024


# -- a throwaway PKI ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalPki:
    """PEM files of a self-signed CA, a server certificate it signed, and a client certificate."""

    folder: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @property
    def ca_pem(self) -> str:
        return self.ca_cert.read_text()


def make_local_pki(
    folder: str | os.PathLike, *, hosts: tuple[str, ...] = (LOOPBACK,), days: int = 2
) -> LocalPki:
    """Write a CA, a server certificate for ``hosts`` (IP addresses become IP SANs, names DNS SANs)
    and a client certificate (``CN=airflow``) into ``folder``; keys are unencrypted, mode 0600."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "emr-ray devstack"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])  # fmt: skip

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("emr-ray devstack test CA"))
        .issuer_name(name("emr-ray devstack test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),  # fmt: skip
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),  # fmt: skip
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server, server_key = leaf(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, sans)
    client, client_key = leaf("airflow", ExtendedKeyUsageOID.CLIENT_AUTH, [])

    pki = LocalPki(folder, folder / "ca.pem", folder / "server.pem", folder / "server-key.pem",
                   folder / "client.pem", folder / "client-key.pem")  # fmt: skip
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.server_cert.write_bytes(server.public_bytes(pem))
    pki.client_cert.write_bytes(client.public_bytes(pem))
    write_key(server_key, pki.server_key)
    write_key(client_key, pki.client_key)
    return pki


# -- the proxy ------------------------------------------------------------------------------------
class TlsProxy:
    """Accept TLS on ``127.0.0.1:<port>`` (or a Unix socket) and pipe the bytes to ``upstream``.

    :param upstream: the plain-http server, ``http://host:port``.
    :param certfile: the server certificate (PEM; may hold the chain); None with ``uds`` for no TLS.
    :param keyfile: its key (PEM, unencrypted).
    :param client_ca: if given, mutual TLS: clients must present a certificate this CA signed.
    :param port: the port to listen on (0: any free port).
    :param uds: listen on this Unix socket path instead of a TCP port.
    """

    def __init__(self, upstream: str, certfile: str | os.PathLike | None = None,
                 keyfile: str | os.PathLike | None = None, *, client_ca: str | os.PathLike | None = None,
                 port: int = 0, uds: str | os.PathLike | None = None) -> None:  # fmt: skip
        parts = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r}: give a plain http://host:port address.")
        if certfile is None and uds is None:
            raise ValueError("give certfile and keyfile (TLS), or uds (a Unix socket, TLS optional).")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.certfile, self.keyfile, self.client_ca = certfile, keyfile, client_ca
        self.port = port
        self.uds = None if uds is None else str(uds)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The address clients use (for ``uds``: the host name only goes into the Host header)."""
        scheme = "http" if self.certfile is None else "https"
        return f"{scheme}://localhost" if self.uds else f"{scheme}://{LOOPBACK}:{self.port}"

    def counts(self) -> dict[str, int]:
        """``connections`` piped (after a TLS handshake that both sides accepted), ``upstream_error``
        (the upstream refused the connection)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.certfile is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.certfile, self.keyfile)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.client_ca))
        return context

    def start(self) -> TlsProxy:
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, args=(ready, failure), daemon=True,
                                        name=f"tls-proxy-{self.port}")  # fmt: skip
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("TLS proxy did not start within 30 s")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the event loop thread ---------------------------------------------------------------------
    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()  # failed handshakes are OSErrors: asyncio logs them at debug
        try:
            server = loop.run_until_complete(self._listen())
        except BaseException as e:  # reported to start()
            failure.append(e)
            loop.close()
            ready.set()
            return
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown(server))
            loop.close()

    async def _listen(self) -> asyncio.AbstractServer:
        context = self.ssl_context()
        if self.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.uds)
            return await asyncio.start_unix_server(self._handle, self.uds, ssl=context)
        server = await asyncio.start_server(self._handle, LOOPBACK, self.port, ssl=context)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _shutdown(self, server: asyncio.AbstractServer) -> None:
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()
        if self.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.uds)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                self._count("upstream_error")
                return
            self._count("connections")
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy until either side ends, then close ``sink`` (the other pipe then ends too)."""
        try:
            while data := await source.read(_CHUNK):
                sink.write(data)
                await sink.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            sink.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TLS in front of a local plain-http dashboard.")
    parser.add_argument("--upstream", default=f"http://{LOOPBACK}:8265")
    parser.add_argument("--dir", default=".state/tls", help="where the CA and certificates are written")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mtls", action="store_true", help="require client certificates")
    args = parser.parse_args(argv)
    pki = make_local_pki(args.dir)
    proxy = TlsProxy(args.upstream, pki.server_cert, pki.server_key, port=args.port,
                     client_ca=pki.ca_cert if args.mtls else None).start()  # fmt: skip
    print(
        f"{proxy.url}  (CA: {pki.ca_cert}; client certificate: {pki.client_cert}, {pki.client_key})",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
