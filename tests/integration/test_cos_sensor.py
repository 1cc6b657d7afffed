"""COSSensor in poke and deferrable modes (the trigger run to its event), and inside a real ``dag.test()``."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from devstack.constants import BUCKET, REGION, SECRET_KEY
from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.hooks.cos_keys import match_keys
from emr_ray.links.cos import COSObjectLink
from emr_ray.sensors.cos import COSSensor
from emr_ray.triggers.cos import COSKeyTrigger
from tests.fixtures.cos import cos_connection_json

pytestmark = pytest.mark.integration


def run_trigger(trigger: COSKeyTrigger, timeout: float = 20) -> dict:
    """Run the trigger until its first (terminal) event, as the triggerer would."""

    async def first_event():
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), timeout))


def make_sensor(**kwargs) -> COSSensor:
    kwargs.setdefault("task_id", "wait")
    kwargs.setdefault("poke_interval", 0.05)
    kwargs.setdefault("timeout", 10)
    return COSSensor(**kwargs)


def trigger_for(sensor: COSSensor) -> COSKeyTrigger:
    return COSKeyTrigger(
        bucket_keys=sensor._keys,
        bucket_name=sensor.bucket_name,
        wildcard_match=sensor.wildcard_match,
        use_regex=sensor.use_regex,
        metadata_keys=sensor.metadata_keys,
        cos_conn_id=sensor.cos_conn_id,
        poke_interval=0.05,
    )


@pytest.fixture
def hook(cos_conn):
    return COSHook(cos_conn)


@pytest.fixture
def layout(hook, cos_prefix):
    """raw/dt=2024-01-0{1,2}/part-*.parquet with _SUCCESS only for the first day."""
    for day in ("2024-01-01", "2024-01-02"):
        for i in range(2):
            hook.upload_bytes(
                b"x" * (i + 1), f"{cos_prefix}raw/dt={day}/part-{i}.parquet", metadata={"rows": "7"}
            )
    hook.upload_bytes(b"", f"{cos_prefix}raw/dt=2024-01-01/_SUCCESS")
    return cos_prefix


CASES = [
    # (id, sensor kwargs given the prefix, expected keys or None when not found)
    ("exact", lambda p: {"bucket_key": f"{p}raw/dt=2024-01-01/_SUCCESS"}, ["raw/dt=2024-01-01/_SUCCESS"]),
    ("exact-missing", lambda p: {"bucket_key": f"{p}raw/dt=2024-01-02/_SUCCESS"}, None),
    (
        "full-url",
        lambda p: {"bucket_key": f"cos://{BUCKET}/{p}raw/dt=2024-01-01/part-0.parquet"},
        ["raw/dt=2024-01-01/part-0.parquet"],
    ),
    (
        "bucket-name",
        lambda p: {"bucket_key": f"{p}raw/dt=2024-01-01/part-1.parquet", "bucket_name": BUCKET},
        ["raw/dt=2024-01-01/part-1.parquet"],
    ),
    (
        "list",
        lambda p: {
            "bucket_key": [
                f"{p}raw/dt=2024-01-01/_SUCCESS",
                f"cos://{BUCKET}/{p}raw/dt=2024-01-02/part-0.parquet",
            ]
        },
        ["raw/dt=2024-01-01/_SUCCESS", "raw/dt=2024-01-02/part-0.parquet"],
    ),
    ("list-one-missing", lambda p: {"bucket_key": [f"{p}raw/dt=2024-01-01/_SUCCESS", f"{p}raw/nope"]}, None),
    (
        "wildcard",
        lambda p: {"bucket_key": f"{p}raw/dt=*/_SUCCESS", "wildcard_match": True},
        ["raw/dt=2024-01-01/_SUCCESS"],
    ),
    (
        "wildcard-many",
        lambda p: {"bucket_key": f"{p}raw/dt=2024-01-02/part-?.parquet", "wildcard_match": True},
        ["raw/dt=2024-01-02/part-0.parquet", "raw/dt=2024-01-02/part-1.parquet"],
    ),
    ("wildcard-none", lambda p: {"bucket_key": f"{p}raw/dt=*/_DONE", "wildcard_match": True}, None),
    (
        "regex",
        lambda p: {"bucket_key": rf"{p}raw/dt=2024-01-0[12]/part-1\.parquet$", "use_regex": True},
        ["raw/dt=2024-01-01/part-1.parquet", "raw/dt=2024-01-02/part-1.parquet"],
    ),
    ("regex-none", lambda p: {"bucket_key": rf"{p}raw/dt=2023-.*", "use_regex": True}, None),
    (
        "check-fn-pass",
        lambda p: {
            "bucket_key": f"{p}raw/dt=2024-01-01/part-*",
            "wildcard_match": True,
            "check_fn": lambda objs, **_: sum(o["Size"] for o in objs) == 3,
        },
        ["raw/dt=2024-01-01/part-0.parquet", "raw/dt=2024-01-01/part-1.parquet"],
    ),
    (
        "check-fn-reject",
        lambda p: {
            "bucket_key": f"{p}raw/dt=2024-01-01/part-*",
            "wildcard_match": True,
            "check_fn": lambda objs, **_: len(objs) > 5,
        },
        None,
    ),
]


@pytest.mark.parametrize(("name", "kwargs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_poke_and_deferrable_agree(name, kwargs, expected, layout, cos_conn):
    sensor = make_sensor(**kwargs(layout))
    result = sensor.poke({})
    assert result.is_done is (expected is not None)
    if expected is not None:
        assert sorted(o["Key"] for o in result.xcom_value) == sorted(layout + k for k in expected)

    # deferrable: the trigger answers only once every key has a match; check_fn runs on resume
    trigger = trigger_for(sensor)
    if expected is None and sensor.check_fn is None:
        with pytest.raises(TimeoutError):
            run_trigger(trigger, timeout=0.5)
        return
    event = run_trigger(trigger)
    assert event["status"] == "success"
    if expected is None:  # check_fn rejects: the sensor defers again instead of succeeding
        from airflow.sdk.exceptions import TaskDeferred

        with pytest.raises(TaskDeferred):
            sensor.execute_complete(
                {}, event, deadline=(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)).isoformat()
            )
        return
    objects = sensor.execute_complete({}, event)
    assert objects == result.xcom_value


def test_metadata_keys(layout, cos_conn):
    key = f"{layout}raw/dt=2024-01-01/part-1.parquet"
    sensor = make_sensor(
        bucket_key=key, metadata_keys=["Size", "ETag", "LastModified", "x-cos-meta-rows", "Content-Type"]
    )
    (obj,) = sensor.poke({}).xcom_value
    assert obj["Size"] == 2 and obj["x-cos-meta-rows"] == "7" and len(obj["ETag"]) == 32
    assert obj["Url"] == f"cos://{BUCKET}/{key}"
    assert dt.datetime.fromisoformat(obj["LastModified"]).tzinfo is not None
    # the same through a listing (wildcard) and the trigger
    wild = make_sensor(
        bucket_key=key.replace("part-1", "part-[1]"), wildcard_match=True, metadata_keys=sensor.metadata_keys
    )
    assert wild.poke({}).xcom_value == [obj]
    assert run_trigger(trigger_for(wild))["objects"] == [obj]
    everything = make_sensor(bucket_key=key, metadata_keys=["*"]).poke({}).xcom_value[0]
    assert everything["x-cos-meta-rows"] == "7" and everything["Size"] == 2


class HeadCountingHook(COSHook):
    """The real hook, noting the keys it sends a HEAD for; every call still goes to the stand-in."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.heads: list[str] = []

    def head_object(self, key: str, bucket_name: str | None = None) -> dict[str, str] | None:
        self.heads.append(key)
        return super().head_object(key, bucket_name)


def test_match_keys_needs_every_key_and_heads_only_for_headers(layout, cos_conn):
    """``match_keys`` itself: exact keys (plain or ``cos://``) take a HEAD each; a pattern lists, and
    takes a HEAD per match only for metadata a listing does not carry (here ``Content-Type``)."""
    hook = HeadCountingHook(cos_conn)
    day1 = f"{layout}raw/dt=2024-01-01/"
    found, objects = match_keys(hook, [f"{day1}part-0.parquet", f"cos://{BUCKET}/{day1}part-1.parquet"])
    assert found and [(o["Key"], o["Size"]) for o in objects] == [
        (f"{day1}part-0.parquet", 1),
        (f"{day1}part-1.parquet", 2),
    ]
    assert match_keys(hook, [f"{day1}_SUCCESS", f"{day1}missing"]) == (False, [])

    hook.heads.clear()
    found, objects = match_keys(hook, f"{day1}part-*", wildcard_match=True, metadata_keys=["Size", "ETag"])
    assert found and [o["Key"] for o in objects] == [f"{day1}part-0.parquet", f"{day1}part-1.parquet"]
    assert hook.heads == []  # Size and ETag come from the listing
    assert match_keys(hook, f"{layout}raw/dt=*/_DONE", wildcard_match=True) == (False, [])
    assert hook.heads == []
    found, objects = match_keys(hook, rf"{day1}part-\d", use_regex=True, metadata_keys=["Content-Type"])
    assert found and hook.heads == [f"{day1}part-0.parquet", f"{day1}part-1.parquet"]  # a header: a HEAD
    assert all(o["Content-Type"] for o in objects)


def test_deferrable_execute_defers_then_completes(hook, cos_conn, cos_prefix):
    from airflow.sdk.exceptions import TaskDeferred

    sensor = make_sensor(bucket_key=f"{cos_prefix}late/_SUCCESS", deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "emr_ray.triggers.cos.COSKeyTrigger"
    rebuilt = COSKeyTrigger(**kwargs)
    hook.upload_bytes(b"", f"{cos_prefix}late/_SUCCESS")
    event = run_trigger(rebuilt)
    result = sensor.execute_complete({}, event, **deferred.value.kwargs)
    assert [o["Key"] for o in result] == [f"{cos_prefix}late/_SUCCESS"]
    # already there: no deferral at all
    assert sensor.execute({})[0]["Key"] == f"{cos_prefix}late/_SUCCESS"


def test_missing_bucket_fails_fast_in_both_modes(cos_conn):
    sensor = make_sensor(bucket_key="raw/_SUCCESS", bucket_name="absent-1250000000")
    with pytest.raises(COSError, match="bucket 'absent-1250000000' does not exist"):
        sensor.poke({})
    event = run_trigger(trigger_for(sensor))
    assert event["status"] == "error" and "absent-1250000000" in event["message"]
    from airflow.sdk.exceptions import AirflowException

    with pytest.raises(AirflowException, match="does not exist"):
        sensor.execute_complete({}, event)


def test_wrong_credentials_are_clear_and_secret_free(cos_server, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_BADKEY", cos_connection_json(cos_server.endpoint, password="bad-secret-key-42")
    )
    sensor = make_sensor(bucket_key="raw/_SUCCESS", cos_conn_id="cos_badkey")
    with pytest.raises(COSError, match="SignatureDoesNotMatch.*password of connection 'cos_badkey'") as err:
        sensor.poke({})
    assert "bad-secret-key-42" not in str(err.value)
    event = run_trigger(trigger_for(sensor))
    assert event["status"] == "error" and "SignatureDoesNotMatch" in event["message"]
    assert "bad-secret-key-42" not in str(event)


def test_bad_arguments():
    with pytest.raises(ValueError, match="not both"):
        COSSensor(task_id="x", bucket_key="k", wildcard_match=True, use_regex=True)
    assert COSSensor.template_fields == ("bucket_key", "bucket_name")


DAG_FILE = """
from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from emr_ray.sensors.cos import COSSensor

with DAG(dag_id="cos_sensor_dag_test", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False) as dag:
    wait = COSSensor(
        task_id="wait",
        bucket_key="dagtest/raw/dt={{ ds }}/_SUCCESS",
        poke_interval=1,
        timeout=30,
        mode="poke",
    )

    @task
    def count(objects: list) -> int:
        return len(objects)

    count(wait.output)
"""


def test_dag_test_with_templated_key(hook, cos_conn, tmp_path, monkeypatch, capsys):
    """A real DAG run from a DAG bundle: the key is templated, the objects reach the next task by XCom."""
    import json

    from tests.fixtures.dag_files import load_dag_file

    module = load_dag_file(tmp_path, "cos_sensor_dag", DAG_FILE, monkeypatch)

    hook.upload_bytes(b"", "dagtest/raw/dt=2024-03-05/_SUCCESS")
    run = module.dag.test(logical_date=dt.datetime(2024, 3, 5, tzinfo=dt.UTC))
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {"wait": "success", "count": "success"}, states
    out = capsys.readouterr()
    assert SECRET_KEY not in out.out + out.err

    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(RenderedTaskInstanceFields).filter_by(dag_id="cos_sensor_dag_test").all()
        counted = (
            session.query(XComModel)
            .filter_by(dag_id="cos_sensor_dag_test", task_id="count", run_id=run.run_id)
            .one()
        )
        value = json.loads(counted.value) if isinstance(counted.value, str) else counted.value
        assert value == 1
        # The console link the sensor stored, as Airflow read it back (get_link) when the task ended.
        link = (
            session.query(XComModel.value)
            .filter_by(
                dag_id="cos_sensor_dag_test", task_id="wait", run_id=run.run_id, key="_link_COSObjectLink"
            )
            .scalar()
        )
        link = json.loads(link) if isinstance(link, str) and link.startswith('"') else link
        assert link == COSObjectLink.url(BUCKET, REGION, "dagtest/raw/dt=2024-03-05/")
    rendered = str([r.rendered_fields for r in rows])
    assert "dagtest/raw/dt=2024-03-05/_SUCCESS" in rendered
    assert SECRET_KEY not in rendered


# ---------------------------------------------------------------------- "keys unchanged for N seconds"

QUIET = 2.0  # inactivity_period of the timed tests: short, but far above one poke's duration


def test_inactivity_arguments():
    with pytest.raises(ValueError, match="negative"):
        COSSensor(task_id="x", bucket_key="k", inactivity_period=-1)
    with pytest.raises(ValueError, match="set inactivity_period too"):
        COSSensor(task_id="x", bucket_key="k", min_objects=3)
    with pytest.raises(ValueError, match="give 1 or more"):
        COSSensor(task_id="x", bucket_key="k", inactivity_period=1, min_objects=0)


def test_inactivity_poke(hook, cos_conn, cos_prefix):
    """Poke mode: every assertion holds whatever the machine's load (waits only ever make them truer)."""
    import time

    pattern = f"{cos_prefix}part/*"
    hook.upload_bytes(b"a", f"{cos_prefix}part/0")
    sensor = make_sensor(bucket_key=pattern, wildcard_match=True, inactivity_period=QUIET, min_objects=2)
    assert not sensor.poke({}).is_done  # one object, fewer than min_objects
    hook.upload_bytes(b"b", f"{cos_prefix}part/1")
    assert not sensor.poke({}).is_done  # first sight of this set: the clock starts now
    time.sleep(QUIET + 0.2)
    hook.upload_bytes(b"bb", f"{cos_prefix}part/1")  # rewritten in place
    assert not sensor.poke({}).is_done  # changed: the clock restarts
    time.sleep(QUIET + 0.2)
    result = sensor.poke({})
    assert result.is_done
    assert [(o["Key"], o["Size"]) for o in result.xcom_value] == [
        (f"{cos_prefix}part/0", 1),
        (f"{cos_prefix}part/1", 2),
    ]
    assert all(len(o["ETag"]) == 32 and o["LastModified"] for o in result.xcom_value)


def test_inactivity_reschedule_dates_from_last_modified(hook, cos_conn, cos_prefix):
    """Reschedule mode: a fresh sensor (as after every resume) judges the set by its newest LastModified."""
    import time

    hook.upload_bytes(b"a", f"{cos_prefix}r/0")
    sensor = make_sensor(bucket_key=f"{cos_prefix}r/0", inactivity_period=QUIET, mode="reschedule")
    assert not sensor.poke({}).is_done  # written just now
    time.sleep(QUIET + 1.2)  # LastModified has 1 s resolution
    fresh = make_sensor(bucket_key=f"{cos_prefix}r/0", inactivity_period=QUIET, mode="reschedule")
    assert fresh.poke({}).is_done


def test_inactivity_deferrable(hook, cos_conn, cos_prefix):
    """Deferrable mode: execute() observes once and the trigger carries on from that observation."""
    import time

    from airflow.sdk.exceptions import TaskDeferred

    key = f"{cos_prefix}d/part-0"
    hook.upload_bytes(b"a", key)

    def defer() -> tuple[COSSensor, TaskDeferred]:
        sensor = make_sensor(bucket_key=key, inactivity_period=QUIET, deferrable=True)
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({})
        return sensor, deferred.value

    # unchanged since execute(): the trigger's first check answers (a 60 s poke_interval would time out)
    sensor, deferred = defer()
    classpath, kwargs = deferred.trigger.serialize()
    assert kwargs["inactivity_period"] == QUIET and kwargs["inactivity_state"]["count"] == 1
    time.sleep(QUIET + 0.2)
    event = run_trigger(COSKeyTrigger(**{**kwargs, "poke_interval": 60}), timeout=10)
    assert event["status"] == "success"
    assert [o["Key"] for o in sensor.execute_complete({}, event, **deferred.kwargs)] == [key]

    # rewritten after execute(): the trigger sees the change and waits a whole period from then on
    sensor, deferred = defer()
    hook.upload_bytes(b"bb", key)
    rewritten = time.monotonic()
    event = run_trigger(COSKeyTrigger(**{**deferred.trigger.serialize()[1], "poke_interval": 0.1}))
    assert time.monotonic() - rewritten >= QUIET
    objects = sensor.execute_complete({}, event, **deferred.kwargs)
    assert [(o["Key"], o["Size"]) for o in objects] == [(key, 2)]


def test_success_persists_console_link(hook, cos_conn, cos_prefix):
    from unittest import mock

    hook.upload_bytes(b"", f"{cos_prefix}raw/dt=2024-01-01/_SUCCESS")
    ti = mock.Mock()
    sensor = make_sensor(bucket_key=f"{cos_prefix}raw/dt=*/_SUCCESS", wildcard_match=True)
    assert sensor.poke({"ti": ti}).is_done
    (call,) = ti.xcom_push.call_args_list
    assert call.kwargs["key"] == "_link_COSObjectLink"
    assert call.kwargs["value"] == (
        f"https://console.cloud.tencent.com/cos/bucket?bucket={BUCKET}&region=ap-guangzhou"
        f"&path={cos_prefix}raw/dt%3D2024-01-01/"
    )
