"""What the audit reads, on tiny data: a generation whole or not by its files and footers, and the
secrets a Jobs API record holds once its spec is decoded."""

from __future__ import annotations

import os

import pyarrow as pa

from emr_ray.audit.rules import find_secrets
from emr_ray.audit.sources import generation_problem, job_records
from emr_ray.cluster import partitions
from emr_ray.cluster.spec import entrypoint


def test_a_generation_is_whole_only_with_every_listed_file_and_its_declared_rows(tmp_path):
    partition = f"file://{tmp_path}/staging/tabular/dt=2026-11-02"
    committed = partitions.write_tables(partition, {"train": pa.table({"x": list(range(8))})}, {})
    assert generation_problem(partition, committed.generation, None) is None

    (path, _) = partitions.dataset_files(committed, "train")[0]
    os.remove(path)  # removed behind its manifest: the manifest still loads
    assert partitions.pinned(partition, committed.generation)
    assert "is missing, its manifest says" in generation_problem(partition, committed.generation, None)
    assert generation_problem(partition, "g-never", None).startswith("not committed")


def test_a_secret_inside_a_jobs_base64_spec_is_found_in_its_decoded_record():
    secret = "AKIDsecret-key-value-0123456789"
    job = {"submission_id": "j1", "entrypoint": entrypoint("emr_ray.cluster.jobs.train", {"key": secret}),
           "metadata": {"airflow_task_id": "train"}}  # fmt: skip
    texts = job_records([job])
    assert secret not in texts["ray job j1 (Jobs API record)"]  # base64: a plain search misses it
    [finding] = find_secrets(texts, [secret])
    assert finding.what.startswith("ray job j1 (decoded entrypoint) holds a secret")
