"""Which staged secrets the wait loops keep alive: only a PENDING job's, named by its reference."""

from __future__ import annotations

from emr_ray.cluster.secrets import SECRET_REF_ENV
from emr_ray.hooks.ray_secrets import staged_ref_of


def _job(status: str, ref: str | None) -> dict:
    env = {SECRET_REF_ENV: ref} if ref else {}
    return {"status": status, "runtime_env": {"env_vars": env}}


def test_a_pending_job_with_staged_secrets_names_its_package():
    assert staged_ref_of(_job("PENDING", "gcs://_emr_ray_secrets_ab12.zip")) == "_emr_ray_secrets_ab12.zip"


def test_running_jobs_jobs_without_secrets_and_foreign_references_are_left_alone():
    assert staged_ref_of(_job("RUNNING", "gcs://_emr_ray_secrets_ab12.zip")) is None
    assert staged_ref_of(_job("PENDING", None)) is None
    assert staged_ref_of(_job("PENDING", "gcs://_ray_pkg_ab12.zip")) is None
    assert staged_ref_of({"status": "PENDING", "runtime_env": None}) is None
