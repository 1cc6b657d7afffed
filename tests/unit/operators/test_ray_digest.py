"""The spec digest that decides whether a retry may reuse an earlier try's Ray job
(``emr_ray.operators.ray.spec_digest``): stable for the same inputs, different for any change in
what the job computes from, blind to secrets and to the force flag."""

from __future__ import annotations

from emr_ray.reuse import FORCE_ENV, code_version, digestible_runtime_env, spec_digest

PAYLOAD = {
    "partition": "2026-11-05",
    "config": {"epochs": 5, "lr": 0.003},
    "identity": {"airflow.task_id": "t"},
}
ENV = {"env_vars": {"PYTHONPATH": "/opt/project", "EMR_RAY_COS_SECRET_KEY": "s3cr3t"}}
CODE = "0.1.0+abc"


def digest(payload=PAYLOAD, env=ENV, module="emr_ray.jobs.train", code=CODE) -> str:
    return spec_digest(module, payload, env, code)


def test_the_same_inputs_give_the_same_digest_whatever_the_key_order():
    reordered = {
        "identity": {"airflow.task_id": "t"},
        "config": {"lr": 0.003, "epochs": 5},
        "partition": "2026-11-05",
    }
    assert digest() == digest(payload=reordered)
    assert len(digest()) == 64 and int(digest(), 16)


def test_any_change_in_what_the_job_computes_from_changes_the_digest():
    changed = {**PAYLOAD, "config": {"epochs": 6, "lr": 0.003}}
    assert digest(payload=changed) != digest()
    assert digest(payload={**PAYLOAD, "partition": "2026-11-06"}) != digest()
    assert digest(module="emr_ray.jobs.spark") != digest()
    assert digest(code="0.1.1+abc") != digest()
    assert digest(env={"env_vars": {**ENV["env_vars"], "PYTHONPATH": "/opt/other"}}) != digest()
    assert digest(env={**ENV, "working_dir": "gcs://_ray_pkg_1234.zip"}) != digest()


def test_secrets_and_the_force_flag_do_not_change_the_digest():
    rotated = {"env_vars": {**ENV["env_vars"], "EMR_RAY_COS_SECRET_KEY": "rotated", "MY_API_TOKEN": "t1"}}
    assert digest(env=rotated) == digest(env={"env_vars": {**ENV["env_vars"], "MY_API_TOKEN": "t2"}})
    assert digest(env={"env_vars": {**ENV["env_vars"], FORCE_ENV: "1"}}) == digest()
    shown = digestible_runtime_env(rotated)
    assert (
        shown["env_vars"]["EMR_RAY_COS_SECRET_KEY"] == "<secret>"
        and shown["env_vars"]["MY_API_TOKEN"] == "<secret>"
    )
    assert shown["env_vars"]["PYTHONPATH"] == "/opt/project"


def test_the_code_version_is_the_provider_version_and_a_hash_of_the_cluster_side_code():
    import emr_ray

    version = code_version()
    assert version.startswith(f"{emr_ray.__version__}+") and len(version.split("+")[1]) == 16
    assert code_version() == version  # computed once per process
