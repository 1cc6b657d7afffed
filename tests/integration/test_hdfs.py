"""``hdfs://`` datasets end to end: storage.py over WebHDFS, the Apache HDFS provider's WebHdfsSensor in a
real DAG run, and a RayDP Spark step that reads and commits ``hdfs://`` partitions with Hadoop's own client.

No HDFS NameNode can run on this machine, so every test talks to the WebHDFS protocol stand-in
(``tests/fixtures/hdfs.py``); the clients are the real ones (fsspec, HdfsCLI, Hadoop 3.3.4's
``WebHdfsFileSystem`` behind ``ViewFileSystemOverloadScheme``).
"""

from __future__ import annotations

import datetime as dt
import json

import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import partitions, storage
from include.data.synthetic import FEATURE_COLUMNS, make_partition
from tests.fixtures.dag_files import load_dag_file
from tests.fixtures.hdfs import HDFS_USER

pytestmark = pytest.mark.integration


def write_raw(root: str, dataset: str, partition: str, rows: int, options) -> str:
    """Write one raw partition through storage.py (pyarrow over WebHDFS), ``_SUCCESS`` last, as producers do."""
    final = storage.partition_uri(root, dataset, partition)
    fsys, path = storage.resolve(final, options)
    fsys.create_dir(path)
    pq.write_table(make_partition(partition, rows), f"{path}/part-00000.parquet", filesystem=fsys)
    storage.write_marker(final, options)
    return final


def test_storage_round_trip_and_generation_commits(webhdfs_server, hdfs_options, hdfs_root):
    """storage.py and partitions.py on hdfs:// through the WebHDFS stand-in (no NameNode can run here):
    a raw partition is written, listed and counted from its footers; a produced partition is committed
    as generations (the manifest by a rename onto a new name), and a rerun's generation becomes current
    while the first stays readable."""
    final = write_raw(hdfs_root, "raw", "2026-11-08", 300, hdfs_options)
    assert final == f"{hdfs_root}/raw/dt=2026-11-08"
    assert storage.is_committed(final, hdfs_options)
    files = storage.list_parquet_files(final, hdfs_options)
    assert files == [f"{storage.split_uri(hdfs_root)[1]}/raw/dt=2026-11-08/part-00000.parquet"]
    assert storage.count_parquet_rows(files, final, hdfs_options) == 300
    table = pq.read_table(files[0], filesystem=storage.filesystem(final, hdfs_options))
    assert table.num_rows == 300 and set(FEATURE_COLUMNS) <= set(table.column_names)
    assert not storage.is_committed(storage.partition_uri(hdfs_root, "raw", "2026-11-09"), hdfs_options)

    staged = storage.partition_uri(hdfs_root, "staged", "2026-11-08")
    first = partitions.write_tables(staged, {"train": table}, {"partition": "2026-11-08"}, hdfs_options)
    second = partitions.write_tables(staged, {"train": table.slice(0, 120)}, {}, hdfs_options)
    assert partitions.current(staged, hdfs_options).generation == second.generation
    pinned = partitions.pinned(staged, first.generation, hdfs_options)
    [(path, size)] = partitions.dataset_files(pinned, "train", hdfs_options)
    assert storage.count_parquet_rows([path], staged, hdfs_options) == 300
    local = webhdfs_server.root / hdfs_root.split("/", 3)[3] / "staged" / "dt=2026-11-08"
    assert sorted(p.name for p in local.iterdir()) == ["_commits", "_generations"]
    assert not [p for p in (local / "_commits").iterdir() if p.name.startswith(".")]  # no temporary left
    with pytest.raises(storage.StorageError, match="e.g. http://namenode:9870"):
        storage.StorageOptions(webhdfs_address="namenode:9870")


DAG_FILE = """
from __future__ import annotations

import datetime as dt

from airflow.providers.apache.hdfs.sensors.web_hdfs import WebHdfsSensor
from airflow.sdk import DAG, task

from emr_ray.cluster import partitions, storage

OPTIONS = storage.StorageOptions(webhdfs_address={address!r}, hdfs_user={user!r})

with DAG(dag_id="hdfs_sensor_dag_test", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False) as dag:
    wait = WebHdfsSensor(
        task_id="wait",
        filepath="{path}/raw/dt={{{{ ds }}}}/_SUCCESS",
        webhdfs_conn_id="webhdfs_default",
        poke_interval=0.5,
        timeout=3,
        mode="poke",
    )

    @task
    def rows(ds=None) -> int:
        uri = storage.partition_uri({root!r}, "raw", ds)
        return storage.count_parquet_rows(storage.list_parquet_files(uri, OPTIONS), uri, OPTIONS)

    wait >> rows()
"""


def test_webhdfs_sensor_in_a_dag_run(
    webhdfs_server, webhdfs_conn, hdfs_options, hdfs_root, tmp_path, monkeypatch, capsys
):
    """The Apache HDFS provider's WebHdfsSensor (HdfsCLI inside) in real ``dag.test()`` runs, against the
    WebHDFS protocol stand-in (no NameNode can run here): a committed partition lets the run through to
    a task that reads its manifest; a missing one times the sensor out and fails the run."""
    path = storage.split_uri(hdfs_root)[1]
    text = DAG_FILE.format(address=webhdfs_server.address, user=HDFS_USER, path=path, root=hdfs_root)
    module = load_dag_file(tmp_path, "hdfs_sensor_dag", text, monkeypatch)
    write_raw(hdfs_root, "raw", "2024-03-05", 200, hdfs_options)

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    run = module.dag.test(logical_date=dt.datetime(2024, 3, 5, tzinfo=dt.UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {"wait": "success", "rows": "success"}, states
    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=module.dag.dag_id, task_id="rows", run_id=run.run_id)
            .one()
        )
        assert (json.loads(row.value) if isinstance(row.value, str) else row.value) == 200
    capsys.readouterr()

    missing = module.dag.test(logical_date=dt.datetime(2024, 3, 6, tzinfo=dt.UTC))
    states = {ti.task_id: ti.state for ti in missing.get_task_instances()}
    assert states == {"wait": "failed", "rows": "upstream_failed"}, states
    out = "".join(capsys.readouterr())
    assert f"{path}/raw/dt=2024-03-06/_SUCCESS" in out
    assert "timed out" in out.lower() or "AirflowSensorTimeout" in out, out[-3000:]


def test_raydp_spark_step_reads_and_commits_hdfs(
    ray_conn, webhdfs_server, webhdfs_conn, hdfs_options, hdfs_root
):
    """RayDPSparkOperator, run as a Ray job, with an ``hdfs://`` input and output: Spark's own Hadoop
    client (hdfs:// mapped onto webhdfs:// by ViewFileSystemOverloadScheme, because no NameNode can
    run here and the WebHDFS server is a protocol stand-in) reads the committed input and writes the
    outputs into a new generation, which partitions.commit makes current."""
    from emr_ray.operators.raydp import RayDPSparkOperator
    from tests.integration.test_ray_jobs import FakeTaskInstance

    write_raw(hdfs_root, "raw", "2026-11-10", 300, hdfs_options)
    operator = RayDPSparkOperator(
        task_id="preprocess",
        preprocess="include.preprocessing.tabular:standardize",
        input_uri=f"{hdfs_root}/raw",
        output_uri=f"{hdfs_root}/staged",
        partition="2026-11-10",
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "finite_columns": FEATURE_COLUMNS,
        },
        hdfs_conn_id=webhdfs_conn,
        poll_interval=1,
    )
    result = operator.execute({"ti": FakeTaskInstance("preprocess")})
    output = f"{hdfs_root}/staged/dt=2026-11-10"
    assert result["rows_in"] == 300 and sum(result["rows_out"].values()) == 300, result
    generation = result["generation"]
    assert result["outputs"] == {
        name: f"{output}/_generations/{generation}/{name}" for name in ("train", "test")
    }

    committed = partitions.current(output, hdfs_options)
    assert committed.generation == generation
    manifest = committed.manifest
    assert manifest["rows_in"] == 300 and manifest["input_uri"] == f"{hdfs_root}/raw/dt=2026-11-10"
    assert {name: item["rows"] for name, item in manifest["outputs"].items()} == result["rows_out"]
    local = webhdfs_server.root / hdfs_root.split("/", 3)[3] / "staged"
    assert [p.name for p in local.iterdir()] == ["dt=2026-11-10"]
    fsys = storage.filesystem(output, hdfs_options)
    for name, rows in result["rows_out"].items():
        folder = local / "dt=2026-11-10" / "_generations" / generation / name
        assert (folder / "_SUCCESS").exists()  # Spark's FileOutputCommitter marker, not listed as data
        files = [path for path, _ in partitions.dataset_files(committed, name, hdfs_options)]
        assert files and all(f.rsplit("/", 1)[1].startswith("part-") for f in files)
        assert storage.count_parquet_rows(files, output, hdfs_options) == rows
        writer = pq.ParquetFile(fsys.open_input_file(files[0])).metadata.created_by
        assert "parquet-mr" in writer, writer  # written by Spark's Java writer, not by pyarrow


def test_training_workers_read_their_shards_from_hdfs(
    ray_conn, mlflow_conn, webhdfs_server, webhdfs_conn, hdfs_options, hdfs_root, tmp_path
):
    """TorchTrainOperator on ``hdfs://`` train and test datasets: each Ray Train worker reads its own
    rows over WebHDFS (the server is a protocol stand-in: no NameNode can run here)."""
    from emr_ray.operators.torch import TorchTrainOperator
    from tests.integration.test_ray_jobs import FakeTaskInstance

    staged = partitions.write_tables(  # a committed generation, as the Spark step commits it
        storage.partition_uri(hdfs_root, "staged", "2026-11-11"),
        {"train": make_partition("2026-11-11", 400), "test": make_partition("2026-11-12", 100)},
        {},
        hdfs_options,
    )
    operator = TorchTrainOperator(
        task_id="train_on_hdfs",
        train_loop="include.models.tabular:train_loop",
        datasets={name: staged.output_uri(name) for name in ("train", "test")},
        storage_path=f"file://{tmp_path}",
        config={"feature_columns": FEATURE_COLUMNS, "label_column": "label", "epochs": 2, "batch_size": 64},
        num_workers=1,
        hdfs_conn_id=webhdfs_conn,
        experiment_name="hdfs-tests",
        poll_interval=1,
    )
    result = operator.execute({"ti": FakeTaskInstance("train_on_hdfs"), "ds": "2026-11-11"})
    assert result["rows"] == {"train": 400, "test": 100}
    assert result["epochs_completed"] == 2 and result["final_metrics"]["train_rows"] == 400
