"""Which Ray job a try runs, and submitting it: list the earlier tries' jobs, let the pure rule
decide (:func:`emr_ray.hooks.ray_reuse.decide`), checking a finished job's result only when the rule
asks; submit this try's own job with its secrets staged apart from its runtime_env
(:func:`emr_ray.hooks.ray_secrets.stage_for_job`) and what reuse compares in its metadata."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from emr_ray.cluster.reuse import DIGEST_KEY, EXTERNAL_KEY, UNREADABLE, encode_external
from emr_ray.cluster.spec import entrypoint
from emr_ray.hooks import ray_secrets
from emr_ray.hooks.ray import RayHook
from emr_ray.hooks.ray_reuse import CHECK_RESULT, Choice, TryJob, decide
from emr_ray.hooks.ray_wait import interpret_job
from emr_ray.identity import TaskIdentity


def choose(
    hook: RayHook,
    identity: TaskIdentity,
    *,
    digest: str,
    external: Mapping[str, str],
    force: bool,
    stale: Callable[[Any], str | None],
) -> Choice:
    """:func:`decide` on the tries' jobs as the Jobs API lists them. Only for the finished job the
    decision would reuse, its result is read and ``stale(raw result)`` says why it no longer stands
    (None when it stands: the operator's ``stale_result``)."""
    jobs: dict[str, dict[str, Any]] = {}
    tries: list[TryJob] = []
    for try_number in range(identity.try_number, 0, -1):
        submission_id = dataclasses.replace(identity, try_number=try_number).submission_id()
        if (job := hook.get_job(submission_id)) is not None:
            jobs[submission_id] = job
            tries.append(TryJob(try_number, submission_id, job["status"], job.get("metadata") or {}))
    while True:
        choice = decide(identity.try_number, tries, digest=digest, external=external, force=force)
        if choice.action != CHECK_RESULT or choice.submission_id is None:
            return choice
        problem = result_problem(hook, choice.submission_id, jobs[choice.submission_id], stale)
        tries = [
            dataclasses.replace(t, result_problem=problem) if t.submission_id == choice.submission_id else t
            for t in tries
        ]


def external_inputs_or_why(read: Callable[[], dict[str, str]], log: Any) -> dict[str, str]:
    """``read()`` (the operator's external inputs), or, when they cannot be read, a record that says
    so: no job is then reused on them, and the job reads them itself (refused keys, a missing
    partition: its own error says which, without retries)."""
    try:
        return read()
    except Exception as e:
        log.warning(
            "Could not read this job's external inputs (%s: %s); an earlier try's job is not reused on them",
            type(e).__name__,
            e,
        )
        return {"external inputs": f"{UNREADABLE}{type(e).__name__}"}


def result_problem(
    hook: RayHook, submission_id: str, job: dict[str, Any], stale: Callable[[Any], str | None]
) -> str:
    """Why a finished earlier job's result no longer stands ("" when it stands): it cannot be read,
    or ``stale(raw result)`` says why (the operator's ``stale_result``)."""
    try:
        event = interpret_job(submission_id, dict(job), hook.get_job_logs(submission_id, job))
        if event["status"] != "success":
            return f"its result cannot be read ({event['message']})"
        return stale(event["result"]) or ""
    except Exception as e:
        return f"its result could not be checked ({type(e).__name__}: {e})"


def submit(
    hook: RayHook,
    log: Any,
    identity: TaskIdentity,
    job_module: str,
    spec: Mapping[str, Any],
    runtime_env: dict[str, Any],
    *,
    secrets: Mapping[str, str],
    digest: str,
    external: Mapping[str, str],
    entrypoint_num_cpus: float | None = None,
    entrypoint_resources: dict[str, float] | None = None,
) -> str:
    """Submit this try's job, its secrets (and the runtime_env's secret-looking variables) staged
    apart from its runtime_env; its metadata names the task and holds what a later try's reuse
    compares (the spec digest, the external inputs). Returns its submission id."""
    submission_id = identity.submission_id()
    runtime_env, moved = ray_secrets.stage_for_job(hook, runtime_env, secrets, log)
    hook.submit_job(
        entrypoint=entrypoint(job_module, dict(spec)),
        submission_id=submission_id,
        runtime_env=runtime_env,
        metadata={
            "airflow_dag_id": identity.dag_id,
            "airflow_run_id": identity.run_id,
            "airflow_task_id": identity.task_id,
            "airflow_try_number": str(identity.try_number),
            DIGEST_KEY: digest,
            **({EXTERNAL_KEY: encode_external(external)} if external else {}),
        },
        entrypoint_num_cpus=entrypoint_num_cpus,
        entrypoint_resources=entrypoint_resources,
        without_env_vars=moved,
    )
    log.info(
        "Submitted Ray job %s (%s, spec digest %s%s)",
        submission_id,
        job_module,
        digest[:12],
        "".join(f"; {name}: {value}" for name, value in sorted(external.items())),
    )
    return submission_id
