"""Integration tests run Airflow code against real local services: every one gets the migrated
metadata DB of the session (``airflow_db`` in ``tests/conftest.py``, migrated once)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _airflow_db(airflow_db):
    """Apply the session's ``airflow_db`` to every test in this folder."""
    return airflow_db
