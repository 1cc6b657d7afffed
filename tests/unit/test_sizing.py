"""The sizing script's pieces that start no server (``bench/sizing.py``): the machine's CPU meter, shapes
given on the command line, costs read from either results file, the example shapes' table, and a
check's calibration and record from measured backfills."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from bench.pipeline import CONTENDERS
from bench.sizing import HostCpu, calibrated, check_table, compared, local_cluster, local_settings
from emr_ray.sizing.model import Line, Nodes, predict
from emr_ray.sizing.shapes import EXAMPLE_SHAPES, load_costs, parse_shape, shapes_for, shapes_table
from tests.unit.test_sizing_model import COSTS, size_record


def test_the_cpu_meter_counts_this_process_busy_seconds():
    with HostCpu(interval=0.05) as meter:
        deadline = time.process_time() + 0.4
        while time.process_time() < deadline:
            pass
    host = meter.result()
    assert 0.3 <= host["cpu_s"] and host["others_busy_cores"] >= 0 and host["machine_cores"] >= 1


def test_a_shape_is_node_groups_of_cpus_and_gpus_and_a_bad_one_names_the_format():
    shape = parse_shape("2x32, 2x8:1")
    assert shape.nodes == (Nodes(2, 32.0), Nodes(2, 8.0, 1.0)) and (shape.cpus, shape.gpus) == (80, 2)
    with pytest.raises(ValueError, match=r"--shape '16': write node groups as COUNTxCPUS\[:GPUS\]"):
        parse_shape("16")
    with pytest.raises(ValueError, match=r"cpus=0.0 per node"):
        parse_shape("4x0")


def test_costs_load_from_this_scripts_results_or_from_bench_pipelines(tmp_path):
    ours = tmp_path / "sizing.json"
    ours.write_text(json.dumps({"costs": COSTS.to_dict()}))
    assert load_costs(ours, "warm") == COSTS
    theirs = tmp_path / "pipeline.json"
    sizes = [size_record(20_000, 10.0, 3.0), size_record(200_000, 12.0, 3.0)]
    theirs.write_text(json.dumps({"machine": {"when": "today"}, "contenders": {"warm": {"sizes": sizes}}}))
    assert load_costs(theirs, "warm").train.job.per_1m == pytest.approx(2 / 0.18, abs=1e-3)
    theirs.write_text(json.dumps({"contenders": {"warm": {"sizes": sizes[:1]}}}))
    with pytest.raises(ValueError, match="no contender with two sizes: measure with --measure"):
        load_costs(theirs, "warm")


def test_the_shapes_table_has_a_row_per_shape_and_size_and_gpus_only_where_there_are():
    text = shapes_table(COSTS, shapes_for([], examples=True), 365, [200_000, 10_000_000])
    rows = text.splitlines()[2:]
    assert len(rows) == 2 * len(EXAMPLE_SHAPES)
    assert [row.split("|")[8].strip() == "-" for row in rows] == [True, True, True, True, False, False]


def backfill_record(days: int, rows: int, wall_s: float, cpu_s: float, others: float) -> dict:
    """What ``run_backfill`` returns, as much of it as the checks read."""
    host = {"cpu_s": cpu_s, "wall_s": wall_s, "others_busy_cores": others, "machine_cores": 2}
    return {"days": days, "rows": rows, "wall_s": wall_s, "utilisation": 0.4, "host": host}


def test_a_calibrated_backfill_is_predicted_back_and_a_check_records_its_error_and_hindsight():
    conf = CONTENDERS["warm_defer_at_once"]
    costs = dataclasses.replace(COSTS, host_cpu_s=Line(30.0, 5.0))
    calibrated_costs = calibrated(costs, backfill_record(3, 200_000, 150.0, 180.0, others=0.5), 3, conf)
    one = local_cluster(3, None, host_cores=1.5)
    again = predict(calibrated_costs, one, local_settings(one, conf), partitions=3, rows=200_000)
    assert again.wall_s == pytest.approx(150.0, abs=0.2) and again.pool_slots == 2

    two = local_cluster(3, 3, host_cores=1.5)
    before = predict(calibrated_costs, two, local_settings(two, conf), partitions=10, rows=200_000)
    assert before.pool_slots == 4 and before.bottleneck == "host cores"
    record = compared(
        calibrated_costs, two, conf, 2, before, backfill_record(10, 200_000, 400.0, 600.0, others=0.0)
    )
    assert record["error_pct"] == pytest.approx(100 * (before.wall_s - 400.0) / 400.0, abs=0.1)
    assert record["hindsight"]["wall_s"] < before.wall_s  # the others left 2 free cores during it, not 1.5
    assert "| 2 node(s), 6 Ray CPUs, pools 4" in check_table([record])


def test_the_provider_prints_the_shapes_table_from_measured_costs_with_no_server(tmp_path, capsys):
    """``python -m emr_ray.sizing``: the operators' tool ships in the package (issue 55); a missing or
    unusable costs file is named with the fix."""
    from emr_ray.sizing.__main__ import main

    costs = tmp_path / "sizing-measure.json"
    costs.write_text(json.dumps({"costs": COSTS.to_dict()}))
    text = main(["--results", str(costs), "--shape", "8x32", "--days", "30", "--rows", "200000"])
    assert "| 8 x 32 CPU " in text and text.startswith("measured costs: ")
    assert len([line for line in text.splitlines() if line.startswith("| ")]) == 1 + len(EXAMPLE_SHAPES) + 1
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "none.json")])
    assert "none.json" in capsys.readouterr().err
