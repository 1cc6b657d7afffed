"""``COSSensor``: wait for objects in Tencent COS, with the semantics users know from ``S3KeySensor``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from emr_ray.cluster import storage
from emr_ray.cluster.promotion import BACKFILL_RUN_TYPE
from emr_ray.hooks.cos import COSHook
from emr_ray.hooks.cos_keys import match_keys
from emr_ray.hooks.cos_unchanged import check_unchanged, with_inactivity_metadata
from emr_ray.links.cos import COSObjectLink
from emr_ray.params import run_type
from emr_ray.triggers.cos import COSKeyTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class COSSensor(BaseSensorOperator):
    """Wait until one or more COS objects exist (optionally matching a pattern and passing ``check_fn``).

    Poke, reschedule and deferrable modes give the same answers: they share one matcher
    (:func:`emr_ray.hooks.cos_keys.match_keys`). The task's XCom is the list of matching objects
    (``Bucket``, ``Key``, ``Url`` and the requested ``metadata_keys``); on success the task's
    "COS Console" extra link opens the folder holding them.

    With ``inactivity_period`` the sensor also waits until the matched set (keys, sizes, ETags) has
    stayed the same for that many seconds, for partitions written in place (Airflow's
    ``S3KeysUnchangedSensor``, as an option). Poke and deferrable modes observe the set for the whole
    period (any object added, removed or rewritten restarts the clock), through one check
    (:func:`emr_ray.hooks.cos_unchanged.check_unchanged`) whose state travels from the worker to the
    trigger and back. In reschedule mode Airflow 3 rebuilds the task and clears its XComs at every
    resume, so there is nothing to compare against: each poke dates the set from its newest
    ``LastModified`` instead, which sees new and rewritten objects but not deletions; use poke or
    deferrable mode when writers delete objects (e.g. Spark's overwrite mode).

    :param bucket_key: a key or a list of keys, each a ``cos://bucket/key`` URL or relative to
        ``bucket_name``; patterns when ``wildcard_match`` or ``use_regex`` (templated).
    :param bucket_name: the bucket of relative keys; defaults to the connection's ``bucket`` (templated).
    :param wildcard_match: treat keys as fnmatch patterns (``raw/dt=*/_SUCCESS``).
    :param use_regex: treat keys as regular expressions, matched from the key's start.
    :param check_fn: ``check_fn(objects, **context) -> bool``; the sensor succeeds only when it returns True.
    :param metadata_keys: metadata reported per object: ``Size`` (default), ``ETag``, ``LastModified``,
        any header (``Content-Type``, ``x-cos-meta-owner``), or ``*`` for all.
    :param cos_conn_id: the ``cos`` connection.
    :param inactivity_period: seconds the matched set must stay unchanged before the sensor succeeds;
        None (default) succeeds as soon as every key matches. ``Size``, ``ETag`` and ``LastModified``
        are then reported for every object.
    :param min_objects: with ``inactivity_period``, the fewest objects the settled set may hold.
    :param fail_fast_on_backfill: in a backfill run, look once and fail at once when the key is
        missing, instead of waiting out ``timeout`` for history that will not arrive.
    :param deferrable: wait in the triggerer instead of a worker slot.
    """

    template_fields: Sequence[str] = ("bucket_key", "bucket_name")
    ui_color = "#00a3ff"
    operator_extra_links = (COSObjectLink(),)

    def __init__(
        self,
        *,
        bucket_key: str | list[str],
        bucket_name: str | None = None,
        wildcard_match: bool = False,
        use_regex: bool = False,
        check_fn: Callable[..., bool] | None = None,
        metadata_keys: list[str] | None = None,
        cos_conn_id: str = COSHook.default_conn_name,
        inactivity_period: float | None = None,
        min_objects: int = 1,
        fail_fast_on_backfill: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fail_fast_on_backfill = fail_fast_on_backfill
        if wildcard_match and use_regex:
            raise ValueError("COSSensor: set wildcard_match or use_regex, not both.")
        if inactivity_period is not None and inactivity_period < 0:
            raise ValueError(
                f"COSSensor: inactivity_period={inactivity_period} is negative: give seconds >= 0, or None."
            )
        if min_objects < 1:
            raise ValueError(f"COSSensor: min_objects={min_objects}: give 1 or more.")
        if min_objects != 1 and inactivity_period is None:
            raise ValueError(
                "COSSensor: min_objects only applies with inactivity_period: set inactivity_period too."
            )
        self.bucket_key = bucket_key
        self.bucket_name = bucket_name
        self.wildcard_match = wildcard_match
        self.use_regex = use_regex
        self.check_fn = check_fn
        self.metadata_keys = metadata_keys
        self.cos_conn_id = cos_conn_id
        self.inactivity_period = inactivity_period
        self.min_objects = min_objects
        self.deferrable = deferrable
        #: the "unchanged" check's state between pokes (poke mode; see the class docstring)
        self._inactivity_state: dict[str, Any] | None = None

    @cached_property
    def hook(self) -> COSHook:
        return COSHook(cos_conn_id=self.cos_conn_id)

    @property
    def _keys(self) -> list[str]:
        return [self.bucket_key] if isinstance(self.bucket_key, str) else list(self.bucket_key)

    @property
    def _metadata_keys(self) -> list[str] | None:
        """The metadata to report: the requested keys, plus what the "unchanged" check needs."""
        if self.inactivity_period is None:
            return self.metadata_keys
        return with_inactivity_metadata(self.metadata_keys)

    def _match(self) -> tuple[bool, list[dict[str, Any]]]:
        return match_keys(
            self.hook,
            self._keys,
            self.bucket_name,
            wildcard_match=self.wildcard_match,
            use_regex=self.use_regex,
            metadata_keys=self._metadata_keys,
        )

    def _settled(self, found: bool, objects: list[dict[str, Any]]) -> bool:
        """Whether the matched set is final: always, unless ``inactivity_period`` asks to watch it."""
        if not found:
            self._inactivity_state = None
            return False
        if self.inactivity_period is None:
            return True
        settled, self._inactivity_state, message = check_unchanged(
            objects,
            self._inactivity_state,
            inactivity_period=self.inactivity_period,
            min_objects=self.min_objects,
            seed_from_last_modified=self.mode == "reschedule",
        )
        self.log.info("COS objects for %s: %s", self._keys, message)
        return settled

    def _succeed(self, objects: list[dict[str, Any]], context: Context) -> list[dict[str, Any]]:
        """Store the console link to the objects' folder; returns the objects (the task's XCom)."""
        if objects:
            bucket = objects[0]["Bucket"]
            keys = [o["Key"] for o in objects if o["Bucket"] == bucket]
            url = COSObjectLink.url(bucket, self.hook.conn_config.region, COSObjectLink.folder_of(keys))
            COSObjectLink.persist(context, url)
        return objects

    def _accept(self, objects: list[dict[str, Any]], context: Context) -> bool:
        if self.check_fn is None:
            return True
        return bool(self.check_fn(objects, **context))

    def _check_partitions(self) -> None:
        """A bad ``dt=`` value in a key can never appear: fail at once, without retries."""
        try:
            storage.validate_partitions_in(*self._keys)
        except storage.StorageError as e:
            raise AirflowFailException(f"{e} (in bucket_key {self._keys})") from e

    def poke(self, context: Context) -> PokeReturnValue:
        self._check_partitions()
        self.log.info("Poking for %s (bucket %s)", self._keys, self.bucket_name or "from connection")
        found, objects = self._match()
        done = self._settled(found, objects) and self._accept(objects, context)
        if done:
            self._succeed(objects, context)
        return PokeReturnValue(is_done=done, xcom_value=objects if done else None)

    def execute(self, context: Context) -> Any:
        self._check_partitions()
        if self.fail_fast_on_backfill and run_type(context) == BACKFILL_RUN_TYPE:
            return self._check_once_for_backfill(context)
        if not self.deferrable:
            return super().execute(context)
        # the objects may already be there: no need to defer
        found, objects = self._match()
        if self._settled(found, objects) and self._accept(objects, context):
            return self._succeed(objects, context)
        self._defer(datetime.now(UTC) + timedelta(seconds=self.timeout))

    def _check_once_for_backfill(self, context: Context) -> Any:
        """A backfill processes history: data that is missing now will not arrive by waiting."""
        found, objects = self._match()
        if found and self._accept(objects, context):
            return self._succeed(objects, context)
        raise AirflowFailException(
            f"Backfill run: {self._keys} not found. Historical data does not arrive by waiting, so this "
            "run fails now; load the partition and clear the run, or leave that date out of the backfill."
        )

    def _defer(self, deadline: datetime) -> None:
        remaining = (deadline - datetime.now(UTC)).total_seconds()
        if remaining <= 0:
            self._give_up(f"COSSensor timed out waiting for {self._keys}.")
        self.defer(
            trigger=COSKeyTrigger(
                bucket_keys=self._keys,
                bucket_name=self.bucket_name,
                wildcard_match=self.wildcard_match,
                use_regex=self.use_regex,
                metadata_keys=self._metadata_keys,
                cos_conn_id=self.cos_conn_id,
                poke_interval=self.poke_interval,
                inactivity_period=self.inactivity_period,
                min_objects=self.min_objects,
                inactivity_state=self._inactivity_state,
            ),
            method_name="execute_complete",
            kwargs={"deadline": deadline.isoformat()},
            timeout=timedelta(seconds=remaining),
        )

    def execute_complete(
        self, context: Context, event: dict[str, Any] | None = None, deadline: str | None = None
    ) -> list[dict[str, Any]]:
        """Resume after the trigger fired: succeed, fail (or skip when ``soft_fail``), or wait again."""
        if not event or event.get("status") != "success":
            message = (event or {}).get("message", "no event from the trigger")
            raise AirflowException(f"COSSensor failed waiting for {self._keys}: {message}")
        objects = event.get("objects", [])
        if self._accept(objects, context):
            return self._succeed(objects, context)
        # with inactivity_period the trigger then watches the set for a whole period again, rather
        # than answering at once with the same settled set
        self._inactivity_state = None
        self.log.info("check_fn rejected %d object(s); waiting again", len(objects))
        end = (
            datetime.fromisoformat(deadline)
            if deadline
            else datetime.now(UTC) + timedelta(seconds=self.timeout)
        )
        self._defer(end)
        return objects  # not reached: _defer raises

    def _give_up(self, message: str) -> None:
        if self.soft_fail:
            raise AirflowSkipException(message)
        raise AirflowException(message)
