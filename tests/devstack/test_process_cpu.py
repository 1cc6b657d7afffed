"""``tree_cpu_seconds``: what ``bench.pipeline`` charges to Airflow's own processes. A task process is
a child its worker reaps, so the reaped children's CPU must count, and a process's own too."""

from __future__ import annotations

import subprocess
import sys

from devstack.airflow import tree_cpu_seconds

# burns ~0.4 CPU-s in a child it waits for, then ~0.2 CPU-s itself, then says so and stays alive
PARENT = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"])
end = time.process_time() + 0.2
while time.process_time() < end:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def test_a_process_tree_counts_its_own_cpu_and_its_reaped_childrens():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "done"
        assert tree_cpu_seconds(parent.pid) >= 0.6
    finally:
        parent.communicate("")
    assert tree_cpu_seconds(parent.pid) == 0.0  # gone: nothing to read
