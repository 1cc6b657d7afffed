"""Which jobs may share a warm Spark session (``emr_ray.cluster.jobs.spark_session``), without a cluster: the
session's name is its configuration, and nothing of one job alone (its secrets, its flags) goes into
the session or its name. On a real cluster: ``tests/integration/test_spark_session.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.jobs.spark_session import NAME_PREFIX, session_key
from emr_ray.cluster.spec import SparkSettings
from emr_ray.cluster.warm.keys import code_identity
from emr_ray.cluster.warm.keys import pool_runtime_env as session_runtime_env

SETTINGS = {
    "num_executors": 1,
    "executor_cores": 1,
    "executor_memory": "1g",
    "placement_group_strategy": None,
}
CONFIGS = {"spark.sql.shuffle.partitions": "4"}
JOB_ENV = {
    "py_modules": ["gcs://_ray_pkg_emr_ray_0123abcd.zip"],
    "env_vars": {"PYTHONPATH": "/srv/project", "EMR_RAY_SECRETS_REF": "gcs://_emr_ray_secrets_x.zip",
                 "EMR_RAY_FORCE": "1"},
}  # fmt: skip


def test_a_session_gets_the_jobs_code_and_environment_but_not_its_secret_reference_or_flags():
    env = session_runtime_env(JOB_ENV)
    assert env == {"py_modules": JOB_ENV["py_modules"], "env_vars": {"PYTHONPATH": "/srv/project"}}
    assert session_runtime_env({"env_vars": {"EMR_RAY_SECRETS_REF": "x"}}) == {}


def test_jobs_with_the_same_configuration_share_one_session_whatever_their_secrets():
    one = session_key(SETTINGS | {"app_name": "dag_a-preprocess"}, CONFIGS, session_runtime_env(JOB_ENV))
    other_job = {
        **JOB_ENV,
        "env_vars": {**JOB_ENV["env_vars"], "EMR_RAY_SECRETS_REF": "gcs://_emr_ray_secrets_y.zip"},
    }
    two = session_key(SETTINGS | {"app_name": "dag_b-preprocess"}, CONFIGS, session_runtime_env(other_job))
    assert one == two and one.startswith(NAME_PREFIX)


@pytest.mark.parametrize(
    "settings, configs, runtime_env",
    [
        (SETTINGS | {"executor_memory": "2g"}, CONFIGS, JOB_ENV),  # other executors
        (SETTINGS, CONFIGS | {"spark.sql.shuffle.partitions": "8"}, JOB_ENV),  # other Spark settings
        (SETTINGS, CONFIGS, JOB_ENV | {"py_modules": ["gcs://_ray_pkg_emr_ray_ffff0000.zip"]}),  # other code
        (SETTINGS, CONFIGS, JOB_ENV | {"pip": ["scikit-learn==1.6.1"]}),  # other packages
    ],
)
def test_any_difference_in_what_shapes_the_session_gets_another_one(settings, configs, runtime_env):
    base = session_key(SETTINGS, CONFIGS, session_runtime_env(JOB_ENV))
    assert session_key(settings, configs, session_runtime_env(runtime_env)) != base


def test_pools_are_single_tenant_by_connection():
    """Two DAGs with the same settings but other connections (another COS account, another MLflow)
    never share a warm pool's processes: the operators' tenant digest is part of every pool's key."""
    from emr_ray.cluster.jobs.train_group import group_key
    from emr_ray.operators.raydp import RayDPSparkOperator

    def tenant(**conns: str) -> str:
        return RayDPSparkOperator(task_id="p", preprocess="m:f", input_uri="file:///i", output_uri="file:///o",
                                  partition="2026-01-01", **conns).tenant()  # fmt: skip

    assert tenant() == tenant() and tenant() != tenant(cos_conn_id="cos_team_b")
    env = session_runtime_env(JOB_ENV)
    assert session_key(SETTINGS, CONFIGS, env, "c", tenant()) != session_key(
        SETTINGS, CONFIGS, env, "c", tenant(cos_conn_id="cos_team_b")
    )
    assert group_key({"num_workers": 2}, env, "c", "a") != group_key({"num_workers": 2}, env, "c", "b")


def test_pools_are_keyed_by_what_a_connection_points_at_not_by_its_id(monkeypatch):
    """Two deployments on one cluster, both with a ``cos_default``, for other accounts: no shared pool.
    The same account with a rotated key keeps its pools (each call carries its own credentials)."""
    import json

    from emr_ray.operators.raydp import RayDPSparkOperator

    def tenant(login: str, secret: str) -> str:
        conn = {"conn_type": "cos", "login": login, "password": secret, "extra": {"region": "ap-guangzhou"}}
        monkeypatch.setenv("AIRFLOW_CONN_COS_DEFAULT", json.dumps(conn))
        return RayDPSparkOperator(task_id="p", preprocess="m:f", input_uri="cos://b/i", output_uri="cos://b/o",
                                  partition="2026-01-01").tenant()  # fmt: skip

    team_a = tenant("AKIDteamA", "secret-a-0123456789")
    assert team_a != tenant("AKIDteamB", "secret-b-0123456789")
    assert team_a == tenant("AKIDteamA", "rotated-a-9876543210")


def test_code_fixed_in_place_on_the_cluster_gets_another_session(tmp_path, monkeypatch):
    """Issue 32, item 1: with code installed on the cluster, the key held settings and runtime_env
    only, so a module fixed in place kept running its old version in a busy session."""
    package = tmp_path / "userpkg_fixed"
    (package / "prep").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "prep" / "__init__.py").write_text("")
    (package / "prep" / "tabular.py").write_text("def preprocess(df, config):\n    return df.limit(5000)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = "userpkg_fixed.prep.tabular:preprocess"
    before = session_key(SETTINGS, CONFIGS, session_runtime_env(JOB_ENV), code_identity([path]))
    assert session_key(SETTINGS, CONFIGS, session_runtime_env(JOB_ENV), code_identity([path])) == before
    (package / "prep" / "tabular.py").write_text("def preprocess(df, config):\n    return df\n")  # the fix
    assert session_key(SETTINGS, CONFIGS, session_runtime_env(JOB_ENV), code_identity([path])) != before


def test_the_session_mode_and_idle_timeout_are_checked_when_the_spec_is_built():
    assert SparkSettings(app_name="a", session="shared", idle_timeout_s=30).session == "shared"
    with pytest.raises(ValueError, match=r"spark_session='warm': use 'job' .* or 'shared'"):
        SparkSettings(app_name="a", session="warm")
    with pytest.raises(ValueError, match=r"idle_timeout_s=0: use at least 1 second"):
        SparkSettings(app_name="a", session="shared", idle_timeout_s=0)
