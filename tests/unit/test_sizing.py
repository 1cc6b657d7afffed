"""The sizing tool the provider ships (``emr_ray.sizing``), no server started: shapes given on the
command line, costs read from either results file, the example shapes' table, the command. The
benchmark's own pieces (its CPU meter, a check's calibration) are checked in ``bench/checks/``."""

from __future__ import annotations

import json

import pytest

from devstack.sizing_samples import COSTS, size_record
from emr_ray.sizing.model import Nodes
from emr_ray.sizing.shapes import EXAMPLE_SHAPES, load_costs, parse_shape, shapes_for, shapes_table


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
