"""A job's exit: bad input fails without retries (exit 2), a disturbed write fails so that the task's
retry writes again (exit 1), and the marked error line says which."""

from __future__ import annotations

import json

import pytest

from emr_ray.cluster import storage
from emr_ray.cluster.jobs._runtime import INPUT_ERROR_EXIT_CODE, main
from emr_ray.cluster.spec import ERROR_MARKER


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (storage.StorageError("Partition cos://b/x has no _SUCCESS marker"), INPUT_ERROR_EXIT_CODE),
        (storage.WriteConflictError("Output 'train' declares 7 rows but its 1 file(s) hold 5"), 1),
    ],
    ids=["bad input", "a write disturbed by a second writer"],
)
def test_a_refusal_a_retry_can_fix_is_not_an_input_error(error, code, capsys, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"payload": "x"}))

    def run(payload):
        raise error

    with pytest.raises(SystemExit) as exited:
        main(run, ["--spec", str(spec)])
    assert exited.value.code == code
    marked = json.loads(capsys.readouterr().out.split(ERROR_MARKER, 1)[1])
    assert marked["input_error"] is (code == INPUT_ERROR_EXIT_CODE) and marked["message"] == str(error)
