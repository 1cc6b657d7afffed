"""The view's MLflow reads keep to a page's budget whatever MLflow does: a read not back in time is
"slow" (the page says so) and lands in the cache for the next page; one read per key is in flight.

MLflow is stood in for by functions that block on an event (the real server behind the fault proxy
is ``tests/integration/test_retraining_view.py``'s): the budget is a matter of threads and clocks.
"""

from __future__ import annotations

import threading
import time

from emr_ray.views.mlflow_reads import Reads


def test_a_read_not_back_by_the_deadline_is_slow_and_the_next_page_gets_it_from_the_cache():
    reads, release, calls = Reads(), threading.Event(), []

    def slow_aliases() -> dict[str, str]:
        calls.append(1)
        release.wait(10)
        return {"champion": "7"}

    started = time.monotonic()
    pages = [
        threading.Thread(target=lambda: reads.get("m", slow_aliases, reads.deadline(0.3))) for _ in range(5)
    ]
    for page in pages:
        page.start()
    answer = reads.get("m", slow_aliases, reads.deadline(0.3))
    for page in pages:
        page.join()
    assert answer.slow and not answer.ok and time.monotonic() - started < 2.0  # six pages, one budget
    assert len(calls) == 1  # one read in flight, however many pages ask
    release.set()
    deadline = time.monotonic() + 5
    while (later := reads.get("m", slow_aliases, reads.deadline(0.05))).slow and time.monotonic() < deadline:
        time.sleep(0.05)
    assert later.ok and later.value == {"champion": "7"} and len(calls) == 1


def test_a_failed_read_says_why_and_is_not_repeated_at_once():
    reads, calls = Reads(), []

    def down() -> None:
        calls.append(1)
        raise ConnectionError("MLflow at http://127.0.0.1:1 refused the connection")

    first = reads.get("m", down, reads.deadline(1.0))
    assert first.error == "ConnectionError: MLflow at http://127.0.0.1:1 refused the connection"
    assert reads.get("m", down, reads.deadline(1.0)).error == first.error and len(calls) == 1
