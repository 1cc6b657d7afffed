"""Which job a try takes (``emr_ray.hooks.ray_reuse.decide``): every case of the reuse rule on plain
records, no Jobs API. The operator's I/O around it (the listing, the result check, stops, submit)
is covered against a fake Jobs API in ``tests/unit/operators/test_ray_reuse.py`` and live in
``tests/integration/test_ray_jobs.py`` (a running job reattached, a stale one stopped)."""

from __future__ import annotations

import pytest

from emr_ray.cluster.reuse import DIGEST_KEY, EXTERNAL_KEY, encode_external
from emr_ray.hooks.ray_reuse import CHECK_RESULT, REATTACH, REFUSE, SUBMIT, TryJob, decide

DIGEST = "d" * 64
RAW = {"the raw partition cos://b/raw/dt=2026-12-01": "3 files, listing 1a2b"}


def job(try_number: int, status: str, digest: str = DIGEST, external: dict | None = None, **fields) -> TryJob:
    metadata = {DIGEST_KEY: digest} | ({EXTERNAL_KEY: encode_external(external)} if external else {})
    return TryJob(try_number, f"sub-t{try_number}", status, metadata, **fields)


def test_nothing_earlier_submits():
    assert decide(1, [], digest=DIGEST, external={}).action == SUBMIT


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "SUCCEEDED"])
def test_this_trys_own_job_with_the_same_spec_is_taken_after_a_lost_submit_answer(status):
    choice = decide(2, [job(2, status)], digest=DIGEST, external={})
    assert (choice.action, choice.submission_id) == (REATTACH, "sub-t2")


@pytest.mark.parametrize(("status", "digest", "says"), [
    ("STOPPED", DIGEST, "(STOPPED); clear the task"),
    ("FAILED", DIGEST, "(FAILED); clear the task"),
    ("RUNNING", "e" * 64, "(RUNNING, another spec); clear the task"),
])  # fmt: skip
def test_this_trys_own_final_or_other_job_is_refused_never_submitted_twice(status, digest, says):
    choice = decide(1, [job(1, status, digest)], digest=DIGEST, external={})
    assert choice.action == REFUSE and says in choice.message and choice.stop == ()


@pytest.mark.parametrize("status", ["PENDING", "RUNNING"])
def test_a_retry_takes_the_earlier_trys_job_still_running_with_the_same_spec(status):
    choice = decide(2, [job(1, status)], digest=DIGEST, external={})
    assert (choice.action, choice.submission_id, choice.stop) == (REATTACH, "sub-t1", ())


def test_a_finished_earlier_job_is_taken_only_once_its_result_was_checked_and_stands():
    asked = decide(2, [job(1, "SUCCEEDED")], digest=DIGEST, external={})
    assert (asked.action, asked.submission_id) == (CHECK_RESULT, "sub-t1")
    stands = decide(2, [job(1, "SUCCEEDED", result_problem="")], digest=DIGEST, external={})
    assert (stands.action, stands.submission_id) == (REATTACH, "sub-t1")
    pruned = decide(2, [job(1, "SUCCEEDED", result_problem="the generation g1 it committed is gone")],
                    digest=DIGEST, external={})  # fmt: skip
    assert pruned.action == SUBMIT and pruned.stop == ()  # finished: nothing to stop
    assert pruned.notes == (
        "Not reusing Ray job sub-t1 of try 1 (SUCCEEDED): the generation g1 it committed is gone",
    )


def test_a_running_job_of_another_spec_is_stopped_and_the_retry_submits():
    choice = decide(2, [job(1, "RUNNING", "e" * 64)], digest=DIGEST, external={})
    assert (choice.action, choice.stop) == (SUBMIT, ("sub-t1",))
    assert "inputs or code changed since try 1" in choice.notes[0]


def test_changed_external_inputs_supersede_a_job_of_the_same_spec():
    landed_again = {name: "4 files, listing 9f9f" for name in RAW}
    choice = decide(2, [job(1, "SUCCEEDED", external=RAW)], digest=DIGEST, external=landed_again)
    assert choice.action == SUBMIT and "changed since" in choice.notes[0]
    same = decide(2, [job(1, "RUNNING", external=RAW)], digest=DIGEST, external=RAW)
    assert (same.action, same.submission_id) == (REATTACH, "sub-t1")
    assert "same external inputs" in same.message


def test_final_earlier_jobs_are_passed_over_and_never_stopped():
    choice = decide(3, [job(2, "FAILED"), job(1, "STOPPED")], digest=DIGEST, external={})
    assert (choice.action, choice.stop, choice.notes) == (SUBMIT, (), ())


def test_the_newest_usable_try_wins_and_superseded_running_ones_are_stopped_first():
    jobs = [job(1, "SUCCEEDED", result_problem=""), job(3, "RUNNING", "e" * 64), job(2, "FAILED")]
    choice = decide(4, jobs, digest=DIGEST, external={})
    assert (choice.action, choice.submission_id, choice.stop) == (REATTACH, "sub-t1", ("sub-t3",))


def test_force_recompute_takes_no_earlier_job_and_stops_those_still_running():
    jobs = [job(2, "RUNNING"), job(1, "SUCCEEDED", result_problem="")]
    choice = decide(3, jobs, digest=DIGEST, external={}, force=True)
    assert (choice.action, choice.stop) == (SUBMIT, ("sub-t2",))
    assert all(note.endswith(": force_recompute") for note in choice.notes) and len(choice.notes) == 2


def test_a_later_trys_job_is_not_this_trys_to_judge():
    choice = decide(1, [job(2, "RUNNING")], digest=DIGEST, external={})
    assert (choice.action, choice.stop) == (SUBMIT, ())
