"""The `cdc-pipeline` command's parser: `--config` before or after the subcommand."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import CONFIG_PATH_ENV
from cdc_pipeline.ops import cli
from cdc_pipeline.ops.cli import build_parser, main

COMMANDS = [
    ["sync", "shop"],
    ["state"],
    ["pending", "shop", "--json"],
    ["restart", "shop", "always"],
    ["snapshot", "shop", "shop.orders"],
    ["requests", "--serve"],
    ["objmap", "add", "shop", "table", "shop.a", "b"],
    ["dead-letters", "list", "shop"],
    ["jvm-archive"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command[:2]))
def test_config_is_taken_before_and_after_the_subcommand(command):
    assert build_parser().parse_args(["--config", "before.yaml", *command]).config == "before.yaml"
    assert build_parser().parse_args([*command, "--config", "after.yaml"]).config == "after.yaml"
    assert build_parser().parse_args(command).config is None


def test_config_after_the_subcommand_wins_over_the_one_before():
    assert build_parser().parse_args(["--config", "a.yaml", "state", "--config", "b.yaml"]).config == "b.yaml"


def test_the_command_reads_the_file_given_after_the_subcommand(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "from-the-environment.yaml"))
    missing = tmp_path / "given-after.yaml"

    assert main(["state", "--config", str(missing)]) == 2

    assert f"configuration file {missing} not found" in capsys.readouterr().err


def test_verify_reports_exit_codes_and_names_keys():
    from cdc_pipeline.ops.verify import DIFFERS, EQUAL, UNCONFIRMED, Leaf, TableReport, VerifyReport, format_report

    table = TableReport("db.t", "db.t", ["id"], chunks=2, source_rows=10, destination_rows=10,
                        leaves=[Leaf([1], [5], changed={(3,)}, missing={(4,)})], changed_columns={"3": ["name"]})
    report = VerifyReport("c", [table])
    assert report.exit_code == DIFFERS
    assert report.as_dict()["tables"][0]["changed_keys"] == [[3]]
    assert report.as_dict()["tables"][0]["differing_ranges"] == [{"lower": [1], "upper": [5]}]
    text = format_report(report)
    assert "1 keys changed: 3" in text and "1 keys missing in the destination: 4" in text
    assert "key 3: columns name differ" in text and "range 1 .. 5 differs" in text
    report.unconfirmed = "a change of db.t at mariadb-bin.000001:4"
    assert report.exit_code == UNCONFIRMED
    assert VerifyReport("c", [TableReport("db.t", "db.t", ["id"])]).exit_code == EQUAL
    assert build_parser().parse_args(["verify", "c", "db.t", "--repair", "--json"]).tables == ["db.t"]


def _load_row(table: str, done: int, total: int, finished: bool) -> dict:
    return {"source_table": table, "rows_done": done, "rows_total": total, "rows_per_second": 10.0,
            "finished_at": "2026-01-01" if finished else None, "eta_seconds": None if finished else 5.0}


def test_state_lists_a_few_tables_of_a_load_one_a_line():
    lines = cli.bulk_snapshot_lines([_load_row("db.a", 5, 5, True), _load_row("db.b", 1, 4, False)])
    assert lines == ["db.a: 5 / 5 rows (100%), 10 rows/s, done", "db.b: 1 / ~4 rows (25%), 10 rows/s, ETA 5 s"]


def test_state_sums_up_a_load_of_many_tables_and_lists_those_not_done():
    tables = [_load_row(f"db.t{index:03d}", 100, 100, True) for index in range(985)]
    tables += [_load_row(f"db.u{index:02d}", index, 100, False) for index in range(15)]
    lines = cli.bulk_snapshot_lines(tables)
    assert lines[0] == "985 of 1000 tables done, 98,605 / ~100,000 rows (98%)"
    assert [line.split(":")[0] for line in lines[1:11]] == [f"db.u{index:02d}" for index in range(14, 4, -1)]
    assert lines[11:] == ["... and 5 more tables not done"]


def test_verify_of_many_tables_names_those_that_differ_and_counts_the_equal_ones():
    from cdc_pipeline.ops.verify import Leaf, TableReport, VerifyReport, format_report

    tables = [TableReport(f"db.t{index}", f"db.t{index}", ["id"], chunks=1, source_rows=5, destination_rows=5)
              for index in range(30)]
    tables[7].leaves = [Leaf([1], [5], missing={(4,)})]
    text = format_report(VerifyReport("c", tables))
    assert text.splitlines()[0].startswith("db.t7 -> db.t7: DIFFERS")
    assert "29 more tables equal (145 rows in the source; --every-table lists them)" in text
    assert "db.t8 -> db.t8: equal" not in text
    assert "db.t8 -> db.t8: equal" in format_report(VerifyReport("c", tables), every_table=True)
    assert build_parser().parse_args(["verify", "c", "--every-table"]).every_table
