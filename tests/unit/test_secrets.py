"""The cluster side of the secret channel, where no cluster is needed: nothing to take, nothing to do."""

from __future__ import annotations

import os

import pytest

from emr_ray.cluster import secrets


def test_without_a_reference_take_and_ensure_env_do_nothing(monkeypatch):
    monkeypatch.delenv(secrets.SECRET_REF_ENV, raising=False)
    before = dict(os.environ)
    assert secrets.take() == {}
    secrets.ensure_env()
    assert dict(os.environ) == before


def test_the_copys_name_travels_only_pickled_inside_what_the_driver_sends(monkeypatch):
    """A worker learns the name of the job's secret copy by unpickling a spec part (or ``carried()``)
    the driver sent it; JSON, the repr and a process of another job never see it (issue 53, item 4)."""
    import pickle

    from emr_ray.cluster.spec import StorageSection

    ref, key = "gcs://_emr_ray_secrets_0123abcd.zip", f"gcs://{secrets.COPY_PREFIX}9f8e7d.zip"
    monkeypatch.setenv(secrets.SECRET_REF_ENV, ref)
    monkeypatch.setattr(secrets, "_copy_names", {ref: key})  # the driver, after take()
    part = StorageSection(cos={"region": "ap-guangzhou"})
    sent, handed = pickle.dumps(part), pickle.dumps(secrets.carried())
    assert key not in part.to_json() and key not in repr(secrets.carried())

    monkeypatch.setattr(secrets, "_copy_names", {})  # a worker of the job, before it got anything
    assert secrets.carried() is None
    assert pickle.loads(sent) == part and secrets.carried() == secrets.CopyName(ref, key)
    monkeypatch.setattr(secrets, "_copy_names", {})
    pickle.loads(handed)
    assert secrets._copy_names == {ref: key}

    monkeypatch.setenv(secrets.SECRET_REF_ENV, ref + "-another-job")  # its reference names no copy here
    assert secrets.carried() is None


def test_a_record_never_holds_a_secret_named_value_and_stays_short():
    """Training config values become MLflow params, a skipped comparison's reason a version tag: anyone
    who may read the run or the model reads them, so secret-looking names are masked as env vars are."""
    from emr_ray.cluster.reuse import RECORD_LIMIT, record_value

    assert record_value("partner_api_token", "tok-5f1e") == "<secret>"
    assert record_value("db_password", "hunter2") == "<secret>"
    assert record_value("lr", 0.003) == "0.003"
    long = record_value("compare.skipped", "Traceback ...\n" * 1000)
    assert len(long) == RECORD_LIMIT and long.endswith("…")


def test_the_job_copy_is_sealed_so_its_name_alone_reads_nothing():
    """The GCS prints a pinned copy's name in its debug log: what the name leads to is the secrets
    sealed with a one-time pad, which travels only with the name inside what the driver sends."""
    blob = b'{"EMR_RAY_COS_SECRET_KEY": "local-demo-secret-key-not-for-production"}'
    sealed, pad = secrets.seal(blob)
    assert b"local-demo-secret" not in sealed and len(sealed) == len(blob)
    assert secrets.unseal(sealed, pad) == blob
    assert secrets.seal(blob)[1] != pad  # a pad is never reused
    with pytest.raises(secrets.SecretsUnavailableError, match="does not match the pad"):
        secrets.unseal(sealed, pad[:-2])
