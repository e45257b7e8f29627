"""`python -m rectoolkit.train`: invalid numbers are refused by name, --help shows defaults, every bundled
workload runs with the defaults (issue 13, issue 14 item 7)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rectoolkit.train import TrainConfig, make_tables
from rectoolkit.train.__main__ import main, parse_args
from rectoolkit.workloads import WORKLOAD_NAMES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, option, shown", [
    (["--batch-size", "0"], "--batch-size", "0"),
    (["--batch-size", "-8"], "--batch-size", "-8"),
    (["--steps", "0"], "--steps", "0"),
    (["--steps", "-3"], "--steps", "-3"),
    (["--max-rows", "0"], "--max-rows", "0"),
    (["--embedding-dim", "-1"], "--embedding-dim", "-1"),
    (["--report-every", "0"], "--report-every", "0"),
    (["--over-arch", "64,0,1"], "--over-arch", "[64, 0, 1]"),
    (["--dense-arch", "64,x"], "--dense-arch", "'64,x'"),
    (["--embedding-lr", "-0.1"], "--embedding-lr", "-0.1"),
    (["--dense-lr", "nan"], "--dense-lr", "nan"),
    (["--zipf-alpha", "-1"], "--zipf-alpha", "-1"),
    (["--sharding-group-size", "0"], "--sharding-group-size", "0"),
    (["--sync-interval", "-2"], "--sync-interval", "-2"),
])
def test_invalid_numbers_are_refused_naming_the_option_and_value(argv, option, shown, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2  # argparse's usage error, before anything runs
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}:" in message and shown in message, message


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("steps", -1), ("max_rows", 0), ("report_every", 0),
                                          ("embedding_dim", 2.5), ("over_arch_layer_sizes", []),
                                          ("dense_lr", float("nan"))])
def test_train_config_refuses_the_same_values_from_python(field, value):
    with pytest.raises(ValueError, match=f"TrainConfig: {field} must be"):
        TrainConfig(**{field: value})


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for expected in ("(default: dlrm26)", "(default: 100)", "(default: the workload's batch_size_per_rank)",
                     "(default: 64,32,1)", "(default: 0.05)", "(default: 0.003)", "(default: 10)", "(default: 0)",
                     "(default: the workload's dim; the smallest one when its tables differ)"):
        assert expected in text, expected


def test_a_workload_with_several_dims_trains_with_the_smallest():
    # small3's tables are 128, 256 and 32 wide (rectoolkit/data/workloads/small3.json); DLRM needs one dim
    tables, _, _, _ = make_tables(TrainConfig(workload="small3"))
    assert [t.embedding_dim for t in tables] == [32, 32, 32]
    tables, _, _, _ = make_tables(TrainConfig(workload="small3", embedding_dim=8))
    assert [t.embedding_dim for t in tables] == [8, 8, 8]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workload", WORKLOAD_NAMES)
def test_every_bundled_workload_runs_from_the_command_line(workload, capsys):
    # only the run length and table size are given: dims, batch size and architecture are the defaults
    assert main(["--workload", workload, "--steps", "2", "--report-every", "1", "--max-rows", "500",
                 "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines[:-1]] == [1, 2]
    assert lines[-1]["summary"]["steps"] == 2


@pytest.mark.timeout(120)
def test_batch_size_zero_from_a_shell_exits_2_without_training():
    result = subprocess.run([sys.executable, "-m", "rectoolkit.train", "--batch-size", "0"], cwd=REPO,
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 2 and result.stdout == ""
    assert "argument --batch-size: must be a positive integer, got 0" in result.stderr


def test_sharding_group_size_and_sync_interval_reach_the_config():
    config = parse_args(["--sharding-group-size", "2", "--sync-interval", "5"]).config
    assert (config.sharding_group_size, config.sync_interval) == (2, 5)
    assert (parse_args([]).config.sharding_group_size, parse_args([]).config.sync_interval) == (None, 1)


def test_no_pipeline_turns_the_train_pipeline_off():
    assert parse_args([]).config.pipeline is True
    assert parse_args(["--no-pipeline"]).config.pipeline is False
