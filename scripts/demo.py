"""`make demo`: run a retraining DAG end to end on the embedded local stack (the tabular one by default).

Starts a COS stand-in and a Ray head on 127.0.0.1 (inside a loopback-only network namespace),
writes three days of raw partitions for the chosen DAG into the local COS bucket, runs
``airflow dags test <dag> <date>``, and prints what was processed, trained and registered.
``make demo ARGS="--dag retrain_text"`` picks another workload (``--help`` lists them).
All state lives in ``.state/demo`` (``make clean`` resets it). Rerunning is safe: each partition's
outputs are replaced, and a finished training with the same inputs is reused, not repeated.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.stack import LocalStack
from emr_ray.cluster import partitions, storage
from emr_ray.params import HISTORY_START_ENV, history_start

PROJECT = Path(__file__).resolve().parents[1]

SHOW = re.compile(r"\[emr_ray\] (epoch|iteration)|Read \d+ rows|Wrote output|Committed generation|superseded|Submitted Ray job|Reattaching"
                  r"|Final test_|champion|Marking task as|Ray \d+\.\d+.* node|ERROR|Error|failed")  # fmt: skip
NOISE = re.compile(r"DeprecationWarning|StatusConsoleListener")


@dataclass(frozen=True)
class Workload:
    """One of the DAGs `make demo` can run: its registered model, where its raw and staged data live."""

    dag_id: str
    model: str
    what: str
    raw: str | None = None  # the raw dataset's folder in the demo bucket (None: the DAG reads no data)
    staged: str | None = None  # its staged folder under the staging root
    write: Callable[[str, str, int, Any, int], list[str]] | None = (
        None  # (root, first day, days, options, rows)
    )


def _tabular(root: str, first: str, days: int, options: Any, rows: int) -> list[str]:
    from include.data import synthetic

    return synthetic.write_partitions(root, first, days, rows, options)


def _digits(root: str, first: str, days: int, options: Any, rows: int) -> list[str]:
    from include.data import digits

    return digits.write_partitions(root, first, days, options)


def _text(root: str, first: str, days: int, options: Any, rows: int) -> list[str]:
    from include.data import text

    return text.write_partitions(root, first, days, options)


def _interactions(root: str, first: str, days: int, options: Any, rows: int) -> list[str]:
    from include.data import interactions

    return interactions.write_partitions(root, first, days, options)


WORKLOADS = {
    w.dag_id: w
    for w in (
        Workload("retrain_tabular", "tabular-mlp", "an MLP on synthetic tabular rows", "raw", "tabular", _tabular),
        Workload("retrain_digits", "digits-cnn", "a CNN on sklearn's 8x8 digits", "raw_digits", "digits", _digits),
        Workload("retrain_text", "text-sentiment", "a sentiment classifier on generated reviews", "raw_text",
                 "text", _text),
        Workload("retrain_recsys", "recsys-two-tower", "a two-tower recommender on generated interactions",
                 "raw_interactions", "recsys", _interactions),
        Workload("retrain_rl", "cartpole-ppo", "PPO (RLlib) on Gymnasium's CartPole"),
    )
}  # fmt: skip


def tidy(line: str) -> str:
    """Drop Airflow's timestamp and logger suffix, and Ray's process prefix, from a log line."""
    line = re.sub(r"^\S+Z \[\w+\s*\]\s+", "", line.rstrip())
    line = re.sub(r"\s+\[(airflow|task)[^\]]*\].*$", "", line)
    line = re.sub(r"^\[ray\] (\x1b\[\d+m)?\(\w+ pid=\d+\)(\x1b\[0m)? ", "[ray] ", line)
    return line[:200]


def run_dag(env: dict[str, str], dag_id: str, date: str, log_path: Path) -> int:
    """``airflow dags test``, its full output to a log file, the lines a user cares about to the console."""
    cmd = [str(Path(sys.executable).with_name("airflow")), "dags", "test", dag_id, date]
    with open(log_path, "w") as log, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True, cwd=PROJECT) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if SHOW.search(line) and not NOISE.search(line):
                print("   ", tidy(line), flush=True)
        return proc.wait()


def summary(stack: LocalStack, workload: Workload, date: str) -> None:
    import mlflow

    model_name = workload.model
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = [
        v for v in client.search_model_versions(f"name='{model_name}'") if v.tags.get("partition") == date
    ]
    latest = max(versions, key=lambda v: int(v.version)) if versions else None
    aliases = client.get_registered_model(model_name).aliases if latest else {}
    print("\n==> Result")
    if workload.staged:
        staged = storage.join(stack.staging_uri, workload.staged, f"dt={date}")
        manifest = partitions.require_current(staged).manifest
        print(f"    partition           {date}  ({raw_root(stack, workload)}/dt={date})")
        print(f"    rows in             {manifest['rows_in']}")
        print(
            "    rows out            " + ", ".join(f"{k}={v['rows']}" for k, v in manifest["outputs"].items())
        )
    if latest:
        run = client.get_run(latest.run_id)
        metrics = {
            k: round(v, 4)
            for k, v in run.data.metrics.items()
            if k.startswith(
                ("test_", "final_", "train_loss", "recall", "popularity", "ndcg", "episode_return")
            )
        }
        print(f"    model               {model_name} version {latest.version}  (run {latest.run_id})")
        print(f"    metrics             {json.dumps(metrics)}")
        print(f"    aliases             {json.dumps(aliases)}")
        print(f"    version tags        partition={latest.tags.get('partition')} "
              f"dag_run={latest.tags.get('airflow.run_id')}")  # fmt: skip
    print("\n==> Where to look")
    print(f"    MLflow store        {stack.tracking_uri}")
    print(
        f"    MLflow UI           .venv/bin/mlflow ui --backend-store-uri {stack.tracking_uri} --host 127.0.0.1"
    )
    print(
        f"    Ray dashboard       {stack.ray.dashboard_url if stack.ray else ''} (while the demo runs, inside its namespace)"
    )
    if workload.staged:
        print(f"    staged data         {stack.staging_uri}/{workload.staged}/dt={date}")
    print(f"    full Airflow log    {stack.root / 'dags_test.log'}")


def raw_root(stack: LocalStack, workload: Workload) -> str:
    """Where the DAG reads its raw partitions in the demo bucket (its Variable's default)."""
    return stack.raw_uri.rsplit("/", 1)[0] + f"/{workload.raw}"


class UserError(Exception):
    """Something the user asked for that cannot run: printed as one line, without a traceback."""


def check_date(value: str) -> str:
    """The ``--date`` the DAG can run: an ISO date, not before the DAGs' first date, not in the future."""
    try:
        storage.validate_partition(value)
    except storage.StorageError as e:
        raise UserError(f"--date {value!r}: {e}") from e
    first, today = history_start().date(), dt.datetime.now(dt.UTC).date()
    if dt.date.fromisoformat(value) < first:
        raise UserError(
            f"--date {value} is before the DAGs' first date {first} (Airflow runs no task before a DAG's "
            f"start_date); pick a later date, or set {HISTORY_START_ENV}=YYYY-MM-DD to move it back."
        )
    if dt.date.fromisoformat(value) >= today:
        raise UserError(
            f"--date {value} is not a complete day yet (today is {today}); pick {today - dt.timedelta(days=1)} or earlier."
        )
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    parser.add_argument("--date", default=yesterday, help="logical date / partition (default: yesterday)")
    parser.add_argument("--rows", type=int, default=20000, help="rows per raw partition (tabular and text)")
    parser.add_argument(
        "--dag",
        default="retrain_tabular",
        choices=sorted(WORKLOADS),
        help="the DAG to run: " + "; ".join(f"{w.dag_id}: {w.what}" for w in WORKLOADS.values()),
    )
    args = parser.parse_args()
    try:
        args.date = check_date(args.date)
        if args.rows < 10:
            raise UserError(
                f"--rows {args.rows}: write at least 10 rows per partition (train and test splits)."
            )
        return run(args)
    except (UserError, storage.StorageError) as e:
        print(f"make demo: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(
            f"make demo: {' '.join(map(str, e.cmd[:3]))} failed with exit {e.returncode}; see above.",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("make demo: interrupted; the local stack was stopped.", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()

    print("==> Starting the local stack (COS stand-in, Ray head) on 127.0.0.1", flush=True)
    stack = LocalStack(PROJECT / ".state" / "demo", PROJECT).start()
    try:
        env = os.environ | stack.dags_test_env()
        workload = WORKLOADS[args.dag]
        if workload.write is not None:
            first = (dt.date.fromisoformat(args.date) - dt.timedelta(days=2)).isoformat()
            written = workload.write(raw_root(stack, workload), first, 3, stack.storage_options(), args.rows)
            print(f"==> Wrote {len(written)} raw partitions: {written[0]} .. {written[-1]}")
        print("==> Preparing the Airflow home (SQLite)", flush=True)
        subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        print(f"==> airflow dags test {workload.dag_id} {args.date}", flush=True)
        code = run_dag(env, workload.dag_id, args.date, stack.root / "dags_test.log")
        if code != 0:
            print(f"\nThe DAG run failed (exit {code}); see {stack.root / 'dags_test.log'}", file=sys.stderr)
            return code
        summary(stack, workload, args.date)
        print(f"\n==> Done in {time.monotonic() - started:.0f}s")
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
