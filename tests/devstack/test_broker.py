"""The local stack's Redis (``devstack.broker``): Debian's redis-server on 127.0.0.1, password
required, reached as Celery reaches it (the ``redis`` client with the broker URL), and stopped
without leaving a process behind."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from devstack.broker import LocalRedis

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server (make setup)")


def test_serves_celerys_client_on_loopback_with_a_private_password(tmp_path: Path):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    server = LocalRedis(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url())
        client.lpush("default", b"message")
        assert client.rpop("default") == b"message"
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert stat.S_IMODE((tmp_path / "redis" / "password").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "redis" / "redis.conf").stat().st_mode) == 0o600
        assert server.password.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        stranger = redis.Redis(host="127.0.0.1", port=server.port, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.AuthenticationError, match="(?i)auth"):
            stranger.ping()
    finally:
        pid = server.process.pid if server.process else None
        server.stop()
    assert pid is not None and not Path(f"/proc/{pid}").exists(), "redis-server outlived stop()"
