"""`make demo`: run the tabular retraining DAG end to end on the embedded local stack.

Starts a COS stand-in and a Ray head on 127.0.0.1 (inside a loopback-only network namespace),
writes three days of synthetic raw partitions into the local COS bucket, runs
``airflow dags test retrain_tabular <date>``, and prints what was processed, trained and registered.
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
from pathlib import Path

from devstack.stack import LocalStack
from emr_ray import partitions, storage
from emr_ray.params import HISTORY_START_ENV, history_start

PROJECT = Path(__file__).resolve().parents[1]

SHOW = re.compile(r"\[emr_ray\] epoch|Read \d+ rows|Wrote output|Committed generation|superseded|Submitted Ray job|Reattaching"
                  r"|Final test_|champion|Marking task as|Ray \d+\.\d+.* node|ERROR|Error|failed")  # fmt: skip
NOISE = re.compile(r"DeprecationWarning|StatusConsoleListener")
DAG_ID = "retrain_tabular"
MODEL = "tabular-mlp"


def tidy(line: str) -> str:
    """Drop Airflow's timestamp and logger suffix, and Ray's process prefix, from a log line."""
    line = re.sub(r"^\S+Z \[\w+\s*\]\s+", "", line.rstrip())
    line = re.sub(r"\s+\[(airflow|task)[^\]]*\].*$", "", line)
    line = re.sub(r"^\[ray\] (\x1b\[\d+m)?\(\w+ pid=\d+\)(\x1b\[0m)? ", "[ray] ", line)
    return line[:200]


def run_dag(env: dict[str, str], date: str, log_path: Path) -> int:
    """``airflow dags test``, its full output to a log file, the lines a user cares about to the console."""
    cmd = [str(Path(sys.executable).with_name("airflow")), "dags", "test", DAG_ID, date]
    with open(log_path, "w") as log, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True, cwd=PROJECT) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if SHOW.search(line) and not NOISE.search(line):
                print("   ", tidy(line), flush=True)
        return proc.wait()


def summary(stack: LocalStack, date: str) -> None:
    import mlflow

    manifest = partitions.require_current(storage.join(stack.staging_uri, "tabular", f"dt={date}")).manifest
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = [v for v in client.search_model_versions(f"name='{MODEL}'") if v.tags.get("partition") == date]
    latest = max(versions, key=lambda v: int(v.version)) if versions else None
    aliases = client.get_registered_model(MODEL).aliases if latest else {}
    print("\n==> Result")
    print(f"    partition           {date}  ({stack.raw_uri}/dt={date})")
    print(f"    rows in             {manifest['rows_in']}")
    print("    rows out            " + ", ".join(f"{k}={v['rows']}" for k, v in manifest["outputs"].items()))
    if latest:
        run = client.get_run(latest.run_id)
        metrics = {
            k: round(v, 4)
            for k, v in run.data.metrics.items()
            if k.startswith(("test_", "final_", "train_loss"))
        }
        print(f"    model               {MODEL} version {latest.version}  (run {latest.run_id})")
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
    print(f"    staged data         {stack.staging_uri}/tabular/dt={date}")
    print(f"    full Airflow log    {stack.root / 'dags_test.log'}")


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
    parser.add_argument("--rows", type=int, default=20000, help="rows per raw partition")
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
        from include.data.synthetic import write_partitions

        first = (dt.date.fromisoformat(args.date) - dt.timedelta(days=2)).isoformat()
        written = write_partitions(stack.raw_uri, first, 3, args.rows, stack.storage_options())
        print(f"==> Wrote {len(written)} raw partitions of {args.rows} rows: {written[0]} .. {written[-1]}")
        print("==> Preparing the Airflow home (SQLite)", flush=True)
        subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        print(f"==> airflow dags test {DAG_ID} {args.date}", flush=True)
        code = run_dag(env, args.date, stack.root / "dags_test.log")
        if code != 0:
            print(f"\nThe DAG run failed (exit {code}); see {stack.root / 'dags_test.log'}", file=sys.stderr)
            return code
        summary(stack, args.date)
        print(f"\n==> Done in {time.monotonic() - started:.0f}s")
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
