"""What the Ray hook retries, and how long it waits (``emr_ray.hooks.ray``): one classification and one
schedule for the polling operator and the trigger. The faults as a real client sees them (refused,
reset, dropped, 502/503, timeouts through a proxy) are in ``tests/devstack/test_fault_proxy.py``."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from emr_ray.exceptions import RayAuthError, RayClusterError, RayJobsApiError
from emr_ray.hooks.ray import AsyncJobsClient, RayHook
from emr_ray.hooks.ray_wait import BACKOFF, Backoff, Outage, is_transient, lost_contact_message

REQUEST = httpx.Request("GET", "http://127.0.0.1:8265/api/jobs/x")


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (500, True), (502, True), (503, True), (504, True), (429, True),
        (400, False), (401, False), (403, False), (404, False), (409, False), (200, False),
        (httpx.ConnectError("[Errno 111] Connection refused", request=REQUEST), True),
        (httpx.ReadError("[Errno 104] Connection reset by peer", request=REQUEST), True),
        (httpx.RemoteProtocolError("Server disconnected without sending a response.", request=REQUEST), True),
        (httpx.ReadTimeout("timed out", request=REQUEST), True),
        (httpx.ConnectTimeout("timed out", request=REQUEST), True),
        (httpx.PoolTimeout("timed out", request=REQUEST), True),
        (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", request=REQUEST), False),
        (httpx.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol."), False),
        (httpx.LocalProtocolError("Illegal header value"), False),
        (ConnectionResetError(104, "reset"), True),
        (TimeoutError(), True),
        (RayJobsApiError("x", status_code=503, transient=True), True),
        (RayJobsApiError("x", status_code=400, transient=False), False),
        (RayAuthError("token"), False),
        (ValueError("a bug"), False),
        (True, False),
    ],
)  # fmt: skip
def test_what_is_transient(failure, transient):
    assert is_transient(failure) is transient


def test_backoff_doubles_from_one_second_to_a_thirty_second_cap():
    assert [BACKOFF.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert [Backoff(first=0.5, cap=3).delay(n) for n in range(1, 6)] == [0.5, 1, 2, 3, 3]


class Clock:
    """Monotonic seconds that advance only when told (the schedule is checked without waiting)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_outage_spends_its_budget_then_gives_up():
    clock = Clock()
    outage = Outage(20, clock=clock)
    waits = []
    while (delay := outage.next_delay()) is not None:
        waits.append(delay)
        clock.now += delay
    assert waits == [1, 2, 4, 8, 5]  # the last wait is cut so the last retry lands on the budget's end
    assert outage.attempts == 6 and outage.elapsed == 20 and outage.left == 0


def test_a_zero_budget_gives_up_at_once():
    assert Outage(0, clock=Clock()).next_delay() is None


def test_the_retry_line_says_what_failed_the_attempt_the_wait_and_the_budget_left():
    clock = Clock()
    outage = Outage(600, clock=clock)
    clock.now += 7
    delay = outage.next_delay()
    assert delay is not None
    line = outage.retry_line("GET /api/jobs/x", RayJobsApiError("answered 503: busy\n  try later\n"), delay)
    assert line == (
        "Ray Jobs API GET /api/jobs/x failed (answered 503: busy try later); retry 1 in 1.0 s, "
        "593 s of the 600 s retry budget left"
    )
    traceback = RayJobsApiError("answered 500: Traceback (most recent call last):\n" + "  File x\n" * 200)
    assert len(outage.retry_line("POST /api/jobs/", traceback, 1.0)) < 450
    given_up = outage.gave_up("GET /api/jobs/x", RayJobsApiError("answered 503: busy", status_code=503))
    assert (
        given_up.transient
        and given_up.http_status == 503
        and "gave up on GET /api/jobs/x after 1 attempts" in str(given_up)
    )


def test_the_lost_contact_message_names_the_job_its_page_and_what_a_retry_does():
    message = lost_contact_message(
        "airflow-x-t1", "http://h:8265/#/jobs/airflow-x-t1", RayJobsApiError("503"), 600
    )
    for part in ("airflow-x-t1", "http://h:8265/#/jobs/airflow-x-t1", "NOT stopped", "may still be running",
                 "reattaches", "600 s", "monitor_retry_seconds"):  # fmt: skip
        assert part in message


class Flaky:
    """A call that fails with ``errors`` in turn, then answers ``"done"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"

    async def awaited(self) -> str:
        return self()


FAST = Backoff(first=0.01, cap=0.02)
BUSY = RayJobsApiError("answered 503", status_code=503, transient=True)


def retry_lines(capsys) -> list[str]:
    """The retry lines the hook logged (Airflow's structlog writes task logs to stdout here)."""
    return [line for line in capsys.readouterr().out.splitlines() if "retry budget left" in line]


def test_sync_calls_retry_transient_failures_and_log_each_retry(capsys):
    hook = RayHook("unused", retry_seconds=5, backoff=FAST)
    flaky = Flaky(BUSY, BUSY)
    assert hook.call_with_retries("GET /x", flaky) == "done"
    retries = retry_lines(capsys)
    assert flaky.calls == 3 and len(retries) == 2 and "retry 2 in" in retries[1]


def test_sync_calls_raise_what_is_not_transient_at_once():
    hook = RayHook("unused", retry_seconds=5, backoff=FAST)
    flaky = Flaky(RayJobsApiError("answered 400", status_code=400))
    with pytest.raises(RayJobsApiError, match="answered 400"):
        hook.call_with_retries("GET /x", flaky)
    assert flaky.calls == 1
    with pytest.raises(RayAuthError):
        hook.call_with_retries("GET /x", Flaky(RayAuthError("token")))


def test_sync_calls_give_up_when_the_budget_is_spent():
    hook = RayHook("unused", retry_seconds=0.05, backoff=FAST)
    with pytest.raises(RayJobsApiError, match=r"gave up on GET /x after \d+ attempts") as raised:
        hook.call_with_retries("GET /x", Flaky(*[BUSY] * 100))
    assert raised.value.transient


def test_without_a_budget_the_first_failure_is_raised():
    flaky = Flaky(BUSY)
    with pytest.raises(RayJobsApiError, match="answered 503$"):
        RayHook("unused").call_with_retries("GET /x", flaky)
    assert flaky.calls == 1


def test_async_calls_follow_the_same_rules(capsys):
    hook = RayHook("unused", retry_seconds=5, backoff=FAST)
    jobs = AsyncJobsClient(hook, client=None)  # type: ignore[arg-type]  # the HTTP client is not used here
    flaky = Flaky(BUSY, BUSY)
    assert asyncio.run(jobs.call_with_retries("GET /x", flaky.awaited)) == "done"
    assert flaky.calls == 3 and len(retry_lines(capsys)) == 2
    with pytest.raises(RayClusterError, match="answered 400"):
        asyncio.run(jobs.call_with_retries("GET /x", Flaky(RayJobsApiError("answered 400")).awaited))
