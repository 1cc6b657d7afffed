"""Which try owns a Ray job now (Airflow side), recorded where an earlier try can read it.

A try that Airflow declared a zombie may run ``on_kill`` late, after a later try took its job over:
the job is the later try's then, and stopping it would fail that try's run. Each try records the
job it took (submitted or reattached) in its task instance's XCom; ``on_kill`` reads it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OWNER_XCOM_KEY = "ray_job_owner"


@dataclass(frozen=True)
class Ownership:
    """This try's claim on ``submission_id``."""

    ti: Any
    try_number: int
    submission_id: str

    def claim(self) -> None:
        """Record that this try owns the job, for an earlier try's late ``on_kill`` to see."""
        self.ti.xcom_push(
            key=OWNER_XCOM_KEY, value={"submission_id": self.submission_id, "try_number": self.try_number}
        )

    def taken_over_by(self, log: Any) -> int | None:
        """The later try that owns the job now, or None (this try owns it, or nobody can say: then the
        job is stopped, as ``on_kill`` must be best effort)."""
        if not hasattr(self.ti, "xcom_pull"):
            return None
        try:
            owner = self.ti.xcom_pull(
                task_ids=self.ti.task_id, key=OWNER_XCOM_KEY, map_indexes=self.ti.map_index
            )
        except Exception as e:
            log.warning("Could not read which try owns Ray job %s (%s)", self.submission_id, e)
            return None
        if isinstance(owner, Mapping) and owner.get("submission_id") == self.submission_id:
            later = int(owner.get("try_number") or 0)
            return later if later > self.try_number else None
        return None
