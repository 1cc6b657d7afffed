"""Start and stop a local Ray head on 127.0.0.1 with token authentication, isolated under one folder.

The head runs exactly as a remote EMR head would: operators reach it through the Jobs API at
``http://127.0.0.1:<dashboard_port>`` with its token. Its temp dir, token and ``HOME`` live under
``state_dir``, so ``rm -rf`` of that folder is a full reset and no other Ray on the machine is touched.
Ray binds some listeners on all interfaces: run it inside a loopback-only network namespace
(``scripts/loopback.sh``), as ``make demo`` and ``make test`` do.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LocalRay:
    """What a client needs to reach the local head."""

    dashboard_url: str
    token: str
    state_dir: Path
    gcs_address: str

    def job_runtime_env(self, project_root: Path) -> dict[str, dict[str, str]]:
        """The runtime_env a ``ray`` connection to this head gives every job: where ``include/`` is,
        and the head's address, so helper processes never pick another Ray found on the machine."""
        return {"env_vars": {"PYTHONPATH": str(project_root), "RAY_ADDRESS": self.gcs_address}}


def _ray_bin() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else "ray"


def cluster_env(state_dir: Path) -> dict[str, str]:
    """Environment every Ray process (and so every job) of the local cluster runs with."""
    state_dir = state_dir.resolve()
    venv_bin = str(Path(sys.executable).parent)
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(state_dir / "auth_token"),
        "RAY_TMPDIR": str(ray_temp_dir(state_dir)),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "RAY_TRAIN_V2_ENABLED": "1",
        "HOME": str(state_dir / "home"),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "SPARK_LOCAL_IP": LOOPBACK,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def ray_temp_dir(state_dir: Path) -> Path:
    """Ray's temp dir: under the state folder, through a short /tmp link when that path is long.

    Ray puts Unix sockets in it, and socket paths may not exceed 107 bytes.
    """
    real = state_dir.resolve() / "tmp"
    real.mkdir(parents=True, exist_ok=True)
    if len(str(real)) <= 40:
        return real
    link = Path(tempfile.gettempdir()) / f"emr-ray-{hashlib.sha256(str(real).encode()).hexdigest()[:10]}"
    if not link.is_symlink():
        link.symlink_to(real, target_is_directory=True)
    return link


def _token(state_dir: Path) -> str:
    path = state_dir / "auth_token"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _wait_for_dashboard(url: str, token: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(
                f"{url}/api/version", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except Exception as e:  # still starting
            last = e
        time.sleep(1)
    raise RuntimeError(f"Ray dashboard at {url} did not answer within {timeout:.0f}s: {last}")


def start_head(
    state_dir: str | os.PathLike,
    *,
    num_cpus: int = 2,
    num_gpus: int = 0,
    gcs_port: int = 6379,
    dashboard_port: int = 8265,
    object_store_memory: int = 1_000_000_000,
    timeout: float = 120.0,
) -> LocalRay:
    """Start ``ray start --head`` on 127.0.0.1 (reusing one already running from ``state_dir``)."""
    state = Path(state_dir).resolve()
    for sub in ("home",):
        (state / sub).mkdir(parents=True, exist_ok=True)
    token = _token(state)
    url = f"http://{LOOPBACK}:{dashboard_port}"
    env = os.environ | cluster_env(state)
    try:
        _wait_for_dashboard(url, token, timeout=1)
        return LocalRay(url, token, state, f"{LOOPBACK}:{gcs_port}")
    except RuntimeError:
        pass
    cmd = [
        _ray_bin(), "start", "--head",
        f"--node-ip-address={LOOPBACK}", f"--port={gcs_port}",
        "--include-dashboard=true", f"--dashboard-host={LOOPBACK}", f"--dashboard-port={dashboard_port}",
        f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
        f"--object-store-memory={object_store_memory}",
        f"--temp-dir={ray_temp_dir(state)}", "--disable-usage-stats",
    ]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    _wait_for_dashboard(url, token, timeout)
    return LocalRay(url, token, state, f"{LOOPBACK}:{gcs_port}")


#: ports of the second node of the test head: both nodes share 127.0.0.1, and a node left on Ray's
#: defaults finds the head's dashboard agent on 52365, starts its own agent without an HTTP server
#: and reports ``driver_agent_http_address`` ``http://127.0.0.1:-1``: the Jobs API then answers 500
#: for the logs of every job whose driver runs there (seen as a task waiting out its retry budget)
SECOND_NODE_PORTS = {
    "node-manager-port": 20030, "object-manager-port": 20031, "metrics-export-port": 20032,
    "dashboard-agent-listen-port": 20033, "dashboard-agent-grpc-port": 20034,
    "runtime-env-agent-port": 20035, "min-worker-port": 23000, "max-worker-port": 23999,
}  # fmt: skip


def add_worker_node(local: LocalRay, *, num_cpus: int = 1, resources: str | None = None) -> None:
    """Join a second local node to the head (tests of multi-node placement), on its own ports."""
    cmd = [
        _ray_bin(),
        "start",
        f"--address={local.gcs_address}",
        f"--node-ip-address={LOOPBACK}",
        f"--num-cpus={num_cpus}",
        *(f"--{k}={v}" for k, v in SECOND_NODE_PORTS.items()),
    ]
    if resources:
        cmd.append(f"--resources={resources}")
    subprocess.run(cmd, env=os.environ | cluster_env(local.state_dir), check=True, stdout=subprocess.DEVNULL)


def _ray_processes_in_this_namespace() -> list[int]:
    """PIDs of Ray's processes (and RayDP's JVMs) that share this process's network namespace."""
    mine = os.readlink("/proc/self/ns/net")
    ancestors = {os.getpid(), os.getppid()}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ancestors:
            continue
        try:
            if os.readlink(entry / "ns" / "net") != mine:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (
            "/site-packages/ray/" in cmdline
            or " -m ray." in cmdline  # Ray's servers run as modules: ray.util.client.server outlived the head
            or cmdline.startswith(("ray::", "ray-dashboard-"))
            or "raydp" in cmdline
        ):
            pids.append(int(entry.name))
    return pids


def stop_head(state_dir: str | os.PathLike) -> None:
    """Stop this cluster's Ray processes.

    Inside a loopback-only namespace (where ``make demo`` and ``make test`` run) only the processes of
    this namespace are stopped, so other Ray clusters on the machine survive; elsewhere it falls back
    to ``ray stop --force``, which stops every Ray of this user.
    """
    state = Path(state_dir).resolve()
    isolated = os.environ.get("EMR_RAY_IN_LOOPBACK") == "1"  # set by scripts/loopback.sh
    if not isolated:
        subprocess.run([_ray_bin(), "stop", "--force"], env=os.environ | cluster_env(state), check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    else:
        # a local cluster keeps no state worth a graceful stop: 3 s for SIGTERM, then SIGKILL
        for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
            for pid in _ray_processes_in_this_namespace():
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while _ray_processes_in_this_namespace() and time.monotonic() < deadline:
                time.sleep(0.5)
    (ray_temp_dir(state) / "ray_current_cluster").unlink(missing_ok=True)


# -- a second cluster that lacks the project ------------------------------------------------------
#: ports of the isolated cluster: none of Ray's defaults (6379, 8265, 10001, 52365, workers
#: 10002-19999), so it runs beside the shared test head in one network namespace
ISOLATED_PORTS = {
    "head": {
        "port": 26379, "dashboard-port": 28265, "ray-client-server-port": 20001,
        "node-manager-port": 20010, "object-manager-port": 20011, "metrics-export-port": 20012,
        "dashboard-agent-listen-port": 20013, "dashboard-agent-grpc-port": 20014,
        "runtime-env-agent-port": 20015, "min-worker-port": 21000, "max-worker-port": 21999,
    },
    "worker": {
        "node-manager-port": 20020, "object-manager-port": 20021, "metrics-export-port": 20022,
        "dashboard-agent-listen-port": 20023, "dashboard-agent-grpc-port": 20024,
        "runtime-env-agent-port": 20025, "min-worker-port": 22000, "max-worker-port": 22999,
    },
}  # fmt: skip
#: set in every process of an isolated cluster (inherited by Ray's workers and RayDP's JVMs): how
#: :func:`stop_isolated_cluster` finds exactly that cluster's processes
CLUSTER_MARKER_ENV = "EMR_RAY_ISOLATED_CLUSTER"


def isolated_python(state_dir: str | os.PathLike) -> Path:
    """A Python that has this venv's packages (Ray, RayDP, torch, MLflow...) but not the project.

    A ``venv --without-pip`` under ``state_dir`` whose ``PYTHONPATH`` (:func:`isolated_env`) is this
    venv's site-packages: ``.pth`` files there are not processed, so the editable install of
    ``emr_ray`` is invisible, and ``include/`` is not on any path: as on an EMR cluster that has the
    libraries but none of our code.
    """
    venv = Path(state_dir).resolve() / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return python


def isolated_env(state_dir: str | os.PathLike) -> dict[str, str]:
    """The environment of every process of the isolated cluster (see :func:`isolated_python`)."""
    import sysconfig

    state = Path(state_dir).resolve()
    python = isolated_python(state)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS")}
    env |= cluster_env(state) | {
        "PYTHONPATH": sysconfig.get_paths()["purelib"],
        "PYTHONNOUSERSITE": "1",
        "PATH": str(python.parent)
        + os.pathsep
        + os.environ.get("PATH", "").replace(str(Path(sys.executable).parent) + os.pathsep, ""),
        "PYSPARK_PYTHON": str(python),
        "PYSPARK_DRIVER_PYTHON": str(python),
        CLUSTER_MARKER_ENV: str(state),
    }
    return env


def _ray_start(state: Path, args: list[str]) -> None:
    python = isolated_python(state)
    cmd = [str(python), "-m", "ray.scripts.scripts", "start", *args]
    subprocess.run(cmd, env=isolated_env(state), cwd=state, check=True, stdout=subprocess.DEVNULL)


def _alive_nodes(url: str, token: str) -> int:
    import json

    request = urllib.request.Request(
        f"{url}/nodes?view=summary", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        summary = json.load(response)["data"]["summary"]
    return sum(1 for node in summary if node.get("raylet", {}).get("state") == "ALIVE")


def start_isolated_cluster(
    state_dir: str | os.PathLike,
    *,
    num_cpus: int = 2,
    worker_cpus: int = 1,
    object_store_memory: int = 500_000_000,
    timeout: float = 120.0,
) -> LocalRay:
    """A head and one worker node whose Python cannot import ``emr_ray`` or ``include``
    (:func:`isolated_python`), on :data:`ISOLATED_PORTS`, started from ``state_dir`` (so no job's
    current directory holds the project either). Jobs must ship the code
    (:mod:`emr_ray.hooks.ray_packages`). Stop it with :func:`stop_isolated_cluster`."""
    state = Path(state_dir).resolve()
    (state / "home").mkdir(parents=True, exist_ok=True)
    token = _token(state)
    head, worker = ISOLATED_PORTS["head"], ISOLATED_PORTS["worker"]
    url = f"http://{LOOPBACK}:{head['dashboard-port']}"
    gcs = f"{LOOPBACK}:{head['port']}"
    temp = ray_temp_dir(state)
    common = [f"--node-ip-address={LOOPBACK}", f"--temp-dir={temp}", "--disable-usage-stats",
              f"--object-store-memory={object_store_memory}"]  # fmt: skip
    _ray_start(
        state,
        ["--head", "--include-dashboard=true", f"--dashboard-host={LOOPBACK}", f"--num-cpus={num_cpus}",
         "--num-gpus=0", *common, *(f"--{k}={v}" for k, v in head.items())],
    )  # fmt: skip
    _wait_for_dashboard(url, token, timeout)
    _ray_start(
        state,
        [f"--address={gcs}", f"--num-cpus={worker_cpus}", "--num-gpus=0", *common,
         *(f"--{k}={v}" for k, v in worker.items())],
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while _alive_nodes(url, token) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the isolated cluster's worker node never joined the head at {gcs}")
        time.sleep(1)
    return LocalRay(url, token, state, gcs)


def _isolated_processes(state: Path) -> list[int]:
    marker = f"{CLUSTER_MARKER_ENV}={state}".encode()
    ancestors = {os.getpid(), os.getppid()}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ancestors:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            pids.append(int(entry.name))
    return pids


def stop_isolated_cluster(state_dir: str | os.PathLike) -> None:
    """Stop exactly the isolated cluster of ``state_dir``: the processes whose environment carries
    its marker (:data:`CLUSTER_MARKER_ENV`). Other Ray clusters, in this namespace or not, keep running."""
    state = Path(state_dir).resolve()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _isolated_processes(state):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while _isolated_processes(state) and time.monotonic() < deadline:
            time.sleep(0.5)
    (ray_temp_dir(state) / "ray_current_cluster").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "start":
        local = start_head(args.state_dir, num_cpus=args.num_cpus)
        print(local.dashboard_url)
    else:
        stop_head(args.state_dir)


if __name__ == "__main__":
    main()
