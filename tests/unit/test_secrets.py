"""The cluster side of the secret channel, where no cluster is needed: nothing to take, nothing to do."""

from __future__ import annotations

import os

from emr_ray.cluster import secrets


def test_without_a_reference_take_and_ensure_env_do_nothing(monkeypatch):
    monkeypatch.delenv(secrets.SECRET_REF_ENV, raising=False)
    before = dict(os.environ)
    assert secrets.take() == {}
    secrets.ensure_env()
    assert dict(os.environ) == before


def test_the_job_scoped_copy_is_named_from_the_reference_without_revealing_it():
    ref = "gcs://_emr_ray_secrets_0123abcd.zip"
    key = secrets.copy_key(ref)
    assert key.startswith("gcs://_emr_ray_job_secrets_") and key.endswith(".zip")
    assert "0123abcd" not in key and key == secrets.copy_key(ref) != secrets.copy_key(ref + "x")


def test_a_record_never_holds_a_secret_named_value_and_stays_short():
    """Training config values become MLflow params, a skipped comparison's reason a version tag: anyone
    who may read the run or the model reads them, so secret-looking names are masked as env vars are."""
    from emr_ray.cluster.reuse import RECORD_LIMIT, record_value

    assert record_value("partner_api_token", "tok-5f1e") == "<secret>"
    assert record_value("db_password", "hunter2") == "<secret>"
    assert record_value("lr", 0.003) == "0.003"
    long = record_value("compare.skipped", "Traceback ...\n" * 1000)
    assert len(long) == RECORD_LIMIT and long.endswith("…")
