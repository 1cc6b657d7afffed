"""Which Ray job a task's try takes: an earlier try's, its own new one, or none (pure, no I/O).

A retry, a cleared task or a try whose submit answer was lost must not run the same work twice, nor
reuse work that no longer stands. :func:`decide` reads the tries' jobs newest first:

- this try's own job (a submit whose answer was lost): taken when it has the same spec digest and
  is not final, else refused (clear the task to run it again);
- an earlier try's PENDING, RUNNING or SUCCEEDED job: taken when its spec digest and its external
  inputs are the same and, finished, its result still stands (the caller checks that one result
  when asked: :data:`CHECK_RESULT`); otherwise superseded, and stopped if it still runs;
- FAILED and STOPPED jobs are final: never taken, never stopped.

``force_recompute`` takes no earlier try's job. The operator does the I/O around it
(:meth:`emr_ray.operators.ray.RayJobOperator._reattach_or_submit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from emr_ray.cluster.reuse import DIGEST_KEY, EXTERNAL_KEY, external_changes
from emr_ray.hooks.ray_wait import REUSABLE_STATES

REATTACH, SUBMIT, REFUSE, CHECK_RESULT = "reattach", "submit", "refuse", "check_result"


@dataclass(frozen=True)
class TryJob:
    """A try's job as the Jobs API lists it: what the decision reads. ``result_problem``: for a
    SUCCEEDED job, why its result no longer stands ("" when it stands; None: not checked yet)."""

    try_number: int
    submission_id: str
    status: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    result_problem: str | None = None

    @property
    def digest(self) -> str | None:
        return self.metadata.get(DIGEST_KEY)


@dataclass(frozen=True)
class Choice:
    """What the try does: ``action`` on ``submission_id`` (reattach, check its result), submit its
    own job, or refuse with ``message``; ``stop``: superseded jobs still running, stopped first;
    ``notes``: why each earlier job was not taken (for the task log)."""

    action: str
    submission_id: str | None = None
    message: str = ""
    stop: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def decide(
    this_try: int, jobs: Sequence[TryJob], *, digest: str, external: Mapping[str, str], force: bool = False
) -> Choice:
    """The try's job from ``jobs`` (any order; tries without a job left out). See the module's rule."""
    stop: list[str] = []
    notes: list[str] = []
    for job in sorted(jobs, key=lambda j: j.try_number, reverse=True):
        if job.try_number == this_try:
            same = job.digest == digest
            if same and job.status in REUSABLE_STATES:
                return Choice(REATTACH, job.submission_id, f"this try's own job ({job.status})")
            return Choice(
                REFUSE,
                job.submission_id,
                f"Ray job {job.submission_id} of this try already exists ({job.status}"
                f"{'' if same else ', another spec'}); clear the task to run it again.",
            )
        if job.try_number > this_try or job.status not in REUSABLE_STATES:
            continue  # a later try's job is not this try's to judge; FAILED, STOPPED: final
        why = "force_recompute" if force else _why_not(job, digest, external)
        if why is None:
            if job.status == "SUCCEEDED" and job.result_problem is None:
                return Choice(CHECK_RESULT, job.submission_id, stop=tuple(stop), notes=tuple(notes))
            inputs = ", same external inputs" if external else ""
            return Choice(
                REATTACH,
                job.submission_id,
                f"try {job.try_number}'s job ({job.status}): same spec digest {digest[:12]}{inputs}",
                stop=tuple(stop),
                notes=tuple(notes),
            )
        notes.append(f"Not reusing Ray job {job.submission_id} of try {job.try_number} ({job.status}): {why}")
        if job.status != "SUCCEEDED":
            stop.append(job.submission_id)
    return Choice(SUBMIT, stop=tuple(stop), notes=tuple(notes))


def _why_not(job: TryJob, digest: str, external: Mapping[str, str]) -> str | None:
    """Why an earlier try's job must not be taken, or None (for a SUCCEEDED job, once its result
    was checked: ``result_problem`` empty)."""
    if job.digest != digest:
        return f"inputs or code changed since try {job.try_number}"
    if changes := external_changes(job.metadata.get(EXTERNAL_KEY), external):
        return "; ".join(changes)
    return job.result_problem or None
