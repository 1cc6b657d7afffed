"""A job's secrets reach its driver and its worker processes, and no page or log of the cluster.

Against the real local Ray head (token auth) and the COS stand-in: the COS SecretKey of the ``cos``
connection is the secret followed here. What a holder of the cluster's token can read is checked
the way they would read it: the Jobs API (job list, job info, job logs), the dashboard's state API
(tasks, actors), and every file in the cluster's own log folder.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from devstack.constants import SECRET_KEY
from devstack.ray_head import ray_temp_dir
from emr_ray.audit import sources
from emr_ray.audit.rules import find_secrets
from emr_ray.cluster.secrets import COPY_PREFIX, SECRET_REF_ENV
from emr_ray.hooks.ray import RayHook
from emr_ray.operators.ray import RayJobOperator
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration

SECRET_NAMES = ["EMR_RAY_COS_SECRET_ID", "EMR_RAY_COS_SECRET_KEY", "PARTNER_API_TOKEN"]
#: a secret the user put in the task's runtime_env (issue 32, item 6: it went out in clear)
USER_TOKEN = "tok-partner-5f1e"
_PAGES = ["/api/jobs/", "/api/v0/tasks?detail=true&limit=10000", "/api/v0/actors?detail=true&limit=10000"]


def _run_probe(ray_conn: str, cos_conn: str, cos_prefix: str) -> tuple[dict, str]:
    ti = FakeTaskInstance("secrets_probe")
    op = RayJobOperator(
        task_id="secrets_probe",
        spec={"payload": f"cos://emr-ray-demo-1250000000/{cos_prefix}in", "secret_probe": SECRET_NAMES},
        runtime_env={"env_vars": {"PARTNER_API_TOKEN": USER_TOKEN, "PARTNER_REGION": "ap-guangzhou"}},
        ray_conn_id=ray_conn,
        cos_conn_id=cos_conn,
        poll_interval=0.5,
    )
    return op.execute({"ti": ti}), op._submission_id


def test_cos_keys_reach_the_driver_and_a_worker_and_no_page_or_log(
    ray_cluster, ray_conn, cos_conn, cos_prefix
):
    result, submission_id = _run_probe(ray_conn, cos_conn, cos_prefix)

    want = hashlib.sha256(SECRET_KEY.encode()).hexdigest()
    assert result["secret_digests"]["driver"]["EMR_RAY_COS_SECRET_KEY"] == want
    assert result["secret_digests"]["worker"]["EMR_RAY_COS_SECRET_KEY"] == want
    assert result["secret_digests"]["worker"]["EMR_RAY_COS_SECRET_ID"] is not None
    token = hashlib.sha256(USER_TOKEN.encode()).hexdigest()  # moved to the secret channel, still there
    assert result["secret_digests"]["driver"]["PARTNER_API_TOKEN"] == token
    assert result["secret_digests"]["worker"]["PARTNER_API_TOKEN"] == token

    hook = RayHook(ray_conn)
    job = hook.get_job(submission_id)
    env = job["runtime_env"].get("env_vars", {})
    assert not set(SECRET_NAMES) & set(env), "secret names in the runtime_env"
    assert env["PARTNER_REGION"] == "ap-guangzhou"  # not secret-looking: stays
    # what the audit (python -m emr_ray.audit) reads: the Jobs API's record with its spec decoded, the
    # driver's log, the dashboard's pages and every node's session logs through the dashboard's log API
    readable = sources.job_records([job]) | sources.cluster_logs(ray_conn)
    readable |= {"driver log": hook.get_job_logs(submission_id)}
    readable |= {page: hook._request("GET", page).text for page in _PAGES}
    assert any("runtime_env_agent" in where for where in readable), "the cluster's session logs were not read"
    assert any("decoded entrypoint" in where for where in readable), "the job's spec was not decoded"
    assert find_secrets(readable, [SECRET_KEY, USER_TOKEN]) == []

    logs = [p for p in ray_temp_dir(ray_cluster.state_dir).rglob("*") if p.is_file() and "logs" in p.parts]
    leaking = [str(p) for p in logs if SECRET_KEY.encode() in _read(p) or USER_TOKEN.encode() in _read(p)]
    assert leaking == []  # the same files read directly, rotated or not

    # single use: the staged blob was taken. The job-scoped copy the worker read is named by a random
    # value the driver drew; the GCS may print that name in its debug log while the copy is pinned, so
    # the copy is sealed with a pad that travels only with what the driver sends (issue 53, item 4):
    # read by its name alone it holds no secret, and no page or log holds the pad
    ref = env[SECRET_REF_ENV]
    assert hook._request("GET", "/api/packages/gcs/" + ref.removeprefix("gcs://"), allow_404=True) is None
    assert result["secret_digests"]["copy"] is not None
    assert result["secret_digests"]["copy_by_name"] == {"found": True, "holds_a_secret": False}
    sealed_address = re.compile(re.escape(COPY_PREFIX) + r"[0-9a-f]+\.zip#")
    assert [where for where, text in readable.items() if sealed_address.search(text)] == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
