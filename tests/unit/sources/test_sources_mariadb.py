"""The MariaDB source helpers of the bulk snapshot that need no server: literals and chunk predicates (SQL text
Spark sends as it is), the binlog order that tells a change committed before a consistent snapshot, and the change
check's binlog scan (pages up to the end, its time budget)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdc_pipeline.copy_text import FIELD_BYTEA, FIELD_DATE, FIELD_PLAIN, FIELD_TEXT
from cdc_pipeline.config import ConnectorConfig, parse_config
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import mariadb
from cdc_pipeline.sources.mariadb import (
    SourceColumn,
    before_snapshot,
    chunk_predicate,
    copy_field_sql,
    copy_text_sql,
    debezium_properties,
    key_value,
    literal,
    stream_passed,
    quote_mysql,
    require_snapshot_position,
    scan_binlog,
)


def test_literals_of_every_key_kind():
    assert literal(42) == "42"
    assert literal("it's a \\ path") == "'it''s a \\\\ path'"
    assert literal(key_value(b"\x00\xff")) == "X'00ff'"
    assert literal(key_value(__import__("decimal").Decimal("1.50"))) == "'1.50'"
    assert quote_mysql("we`ird") == "`we``ird`"


def test_chunk_predicates_cover_a_composite_key_half_open():
    assert chunk_predicate(["a"], None, None) == "1 = 1"
    assert chunk_predicate(["a"], [5], [10]) == "((`a` >= 5)) AND NOT ((`a` >= 10))"
    assert chunk_predicate(["a", "b"], [1, "x"], None) == "((`a` > 1) OR (`a` = 1 AND `b` >= 'x'))"


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000002", "pos": 99}, True),  # an earlier file
    ({"file": "mariadb-bin.000003", "pos": 4511}, True),  # its transaction starts before the snapshot
    ({"file": "mariadb-bin.000003", "pos": 4512}, False),  # the first transaction after it
    ({"file": "mariadb-bin.000004", "pos": 4}, False),
    ({"file": "mariadb-bin.000003", "pos": 10, "snapshot": "true"}, False),  # snapshot records have no order
    (None, False),
])
def test_changes_committed_before_a_consistent_snapshot(offset, expected):
    assert before_snapshot(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000003", "pos": 4511}, False),
    ({"file": "mariadb-bin.000003", "pos": 4512}, True),  # the first transaction after the snapshot
    ({"file": "mariadb-bin.000004", "pos": 4}, True),
    ({"file": "mariadb-bin.000004", "pos": 4, "snapshot": "true"}, False),
    (None, False),
])
def test_a_snapshot_position_is_passed_at_the_first_transaction_after_it(offset, expected):
    assert stream_passed(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


class RecordedCursor:
    """A cursor that records the statements it is given and answers each with the rows a server was seen to give
    (no MySQL server can run here: these answers are MySQL 8.0's and MariaDB 11's, recorded)."""

    def __init__(self, answers: dict[str, list[tuple]]) -> None:
        self.answers = answers
        self.statements: list[str] = []

    def execute(self, statement: str) -> None:
        self.statements.append(statement)
        self._rows = self.answers[statement]

    def fetchall(self) -> list[tuple]:
        return self._rows


SNAPSHOT_STATUS = "SHOW SESSION STATUS LIKE 'binlog\\_snapshot\\_file'"


def test_a_keyless_table_loads_from_mariadb_whose_snapshot_has_a_binlog_position():
    mariadb = RecordedCursor({SNAPSHOT_STATUS: [("Binlog_snapshot_file", "mariadb-bin.000003")]})
    require_snapshot_position(mariadb, _connector("mariadb"), "shop.notes")
    assert mariadb.statements == [SNAPSHOT_STATUS]


def test_a_keyless_table_from_mysql_is_refused_with_what_to_do():
    mysql = RecordedCursor({SNAPSHOT_STATUS: []})  # MySQL 8.0 has no binlog_snapshot_* status
    with pytest.raises(CdcError) as refused:
        require_snapshot_position(mysql, _connector("mysql"), "shop.notes")
    message = str(refused.value)
    assert "shop.notes" in message and "primary key" in message and "snapshot_engine: debezium" in message
    assert "'m'" in message, "the error names the connector"
    assert mysql.statements == [SNAPSHOT_STATUS], "nothing of MariaDB's (information_schema.session_status) is asked"


def _connector(kind: str) -> ConnectorConfig:
    config = parse_config({"destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
                           "connectors": {"m": {"type": kind, "hostname": "localhost", "user": "cdc",
                                                "password": "secret", "database": "shop"}}}, Path("x.yaml"))
    return config.connector("m")


def test_the_database_include_list_matches_the_name_as_spelled():
    # Debezium reads it as a regular expression: `$` would end the name, `.` match any character.
    connector = dataclasses.replace(_connector("mariadb"), database="shop$1.a")
    assert debezium_properties(connector)["database.include.list"] == "shop\\$1\\.a"


@pytest.mark.parametrize("data_type, column_type, pg_type, rendered", [
    ("varchar", "varchar(10)", "varchar(10)", True), ("longblob", "longblob", "bytea", True),
    ("bit", "bit(10)", "bit(10)", True), ("datetime", "datetime(3)", "timestamp(3)", True),
    ("decimal", "decimal(12,2)", "numeric(12,2)", True), ("point", "point", "point", True),
    ("set", "set('a','b')", "text", True),
    # Spark renders these: a TIMESTAMP (its zero dates are counted), a SET as an array, other geometries.
    ("timestamp", "timestamp", "timestamptz", False), ("set", "set('a','b')", "text[]", False),
    ("geometry", "geometry", "geometry", False),
])
def test_the_source_renders_a_copy_text_field_where_spark_adds_nothing(data_type, column_type, pg_type, rendered):
    column = SourceColumn("c", data_type, column_type, True)
    field = copy_text_sql(column, pg_type)
    assert (field is not None) == rendered
    if rendered:
        assert field.startswith("COALESCE(") and field.endswith("_utf8mb4 X'5c4e')")  # NULL as \N


@pytest.mark.parametrize("data_type, column_type, pg_type, select, kind", [
    ("varchar", "varchar(10)", "varchar(10)", "`c`", FIELD_TEXT),
    ("enum", "enum('a','b')", "text", "CAST(`c` AS CHAR)", FIELD_TEXT),  # Spark would pad a CHAR(n)
    ("datetime", "datetime(3)", "timestamp(3)", "CAST(`c` AS CHAR)", FIELD_DATE),
    ("int", "int", "integer", "CAST(`c` AS CHAR)", FIELD_PLAIN),
    ("longblob", "longblob", "bytea", "`c`", FIELD_BYTEA),  # its bytes: the writer makes the hex text
    ("bit", "bit(10)", "bit(10)", "LPAD(BIN(`c`), 10, '0')", FIELD_PLAIN),
])
def test_the_source_selects_a_plain_value_the_writer_makes_a_copy_field(data_type, column_type, pg_type, select,
                                                                        kind):
    # No per-row escaping in the source: the bulk load's tasks escape text and write a zero date as NULL.
    assert copy_field_sql(SourceColumn("c", data_type, column_type, True), pg_type) == (select, kind)


def test_what_spark_renders_the_source_selects_no_copy_field_for():
    assert copy_field_sql(SourceColumn("c", "timestamp", "timestamp", True), "timestamptz") is None
    assert copy_field_sql(SourceColumn("c", "set", "set('a')", True), "text[]") is None


class BinlogCursor:
    """A cursor over a binlog of a few files, answering `SHOW BINARY LOGS` and paged `SHOW BINLOG EVENTS` as MariaDB
    does (rows: file, position, kind, server id, end position, info); it counts the events it hands out."""

    def __init__(self, files: dict[str, list[tuple[str, str]]]) -> None:
        self.events: dict[str, list[tuple]] = {}
        for name, events in files.items():
            pos, rows = 4, []
            for kind, info in events:
                rows.append((name, pos, kind, 1, pos + 100, info))
                pos += 100
            self.events[name] = rows
        self.pages: list[tuple[str, int, int]] = []

    def execute(self, statement: str, args: tuple = ()) -> None:
        if statement == "SHOW BINARY LOGS":
            self._rows = [(name, 4 + 100 * len(rows)) for name, rows in self.events.items()]
            return
        assert statement == "SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s"
        name, pos, limit = args
        self.pages.append(args)
        rows = self.events[name]
        starts = [row[1] for row in rows]
        assert pos in starts or pos == 4 + 100 * len(rows), "SHOW BINLOG EVENTS starts at an event"
        self._rows = [row for row in rows if row[1] >= pos][:limit]

    def fetchall(self) -> list[tuple]:
        return self._rows


def _foreign(count: int) -> list[tuple[str, str]]:
    """`count` events of a transaction of another database's table."""
    kinds = [("Gtid", "BEGIN GTID 0-1-1"), ("Table_map", "table_id: 22 (other.t)"),
             ("Write_rows_v1", "table_id: 22 flags: STMT_END_F"), ("Xid", "COMMIT /* xid=14 */")]
    return [kinds[i % len(kinds)] for i in range(count)]


def _captured(table: str) -> bool:
    return table == "shop.items"


def _shop_ddl(statement: str) -> bool:
    return "shop" in statement


def test_a_check_reads_the_binlog_page_by_page_to_the_end_it_was_given(monkeypatch):
    monkeypatch.setattr(mariadb, "BINLOG_PAGE_EVENTS", 4)
    cursor = BinlogCursor({"bin.000001": _foreign(10), "bin.000002": _foreign(9) + [("Table_map",
                                                                                     "table_id: 5 (shop.items)")]})
    end = {"file": "bin.000002", "pos": 904}  # the captured change comes after the end: the next check's
    scan = scan_binlog(cursor, {"file": "bin.000001", "pos": 204}, end, _captured, _shop_ddl, 60)
    assert scan.found is None and scan.at_end and scan.reached == end
    assert scan.events == 8 + 9
    assert cursor.pages == [("bin.000001", 204, 4), ("bin.000001", 604, 4), ("bin.000001", 1004, 4),
                            ("bin.000002", 4, 4), ("bin.000002", 404, 4), ("bin.000002", 804, 4)]


def test_a_check_out_of_time_says_how_far_it_read_and_that_it_did_not_reach_the_end(monkeypatch):
    monkeypatch.setattr(mariadb, "BINLOG_PAGE_EVENTS", 4)
    cursor = BinlogCursor({"bin.000001": _foreign(40)})
    scan = scan_binlog(cursor, {"file": "bin.000001", "pos": 4}, {"file": "bin.000001", "pos": 4004}, _captured,
                       _shop_ddl, 0)
    assert scan.found is None and not scan.at_end
    assert scan.reached == {"file": "bin.000001", "pos": 404} and scan.events == 4, "one page, then the budget"


@pytest.mark.parametrize("event, found", [
    (("Table_map", "table_id: 5 (shop.items)"), "a change of shop.items at bin.000001:404"),
    (("Query", "use `shop`; ALTER TABLE items ADD c INT"), "a schema change at bin.000001:404"),
    (("Table_map", "table_id: 6 (shop.notes)"), None),  # a table the connector does not capture
    (("Query", "BEGIN"), None),
])
def test_a_check_stops_at_the_first_event_of_the_connector(event, found):
    cursor = BinlogCursor({"bin.000001": _foreign(4) + [event] + _foreign(3)})
    scan = scan_binlog(cursor, {"file": "bin.000001", "pos": 4}, {"file": "bin.000001", "pos": 804}, _captured,
                       _shop_ddl, 60)
    assert scan.found == found and scan.at_end is (found is None)
    if found:
        assert scan.reached == {"file": "bin.000001", "pos": 404}


def test_a_purged_or_reset_binlog_asks_for_a_run():
    cursor = BinlogCursor({"bin.000002": _foreign(4)})
    gone = scan_binlog(cursor, {"file": "bin.000001", "pos": 4}, {"file": "bin.000002", "pos": 404}, _captured,
                       _shop_ddl, 60)
    assert gone.found == "binlog file bin.000001 no longer exists" and not gone.at_end
    reset = scan_binlog(cursor, {"file": "bin.000002", "pos": 904}, {"file": "bin.000002", "pos": 404}, _captured,
                        _shop_ddl, 60)
    assert "past the binlog's end" in reset.found and not reset.at_end


def test_by_default_a_run_waits_out_the_binlog_clients_reconnect_after_a_source_restart():
    # The keep-alive thread reconnects one to two intervals after the loss, then connects within connect.timeout.ms
    # (tests/faults/test_faults.py restarts a source with a shorter interval, so as not to wait for it).
    connector = _connector("mariadb")
    properties = debezium_properties(connector)
    reconnect_seconds = (2 * int(properties["connect.keep.alive.interval.ms"])
                         + int(properties["connect.timeout.ms"])) / 1000
    assert properties["connect.keep.alive.interval.ms"] == "60000"
    assert connector.source_lost_timeout_seconds > reconnect_seconds


def test_mariadb_gtid_lists_are_read_per_domain() -> None:
    """A stored offset's GTIDs against the oldest binlog's Gtid_list (`mariadb.lost_position`): the highest sequence
    number of each replication domain."""
    assert mariadb.mariadb_gtid_domains("[0-1-57,1-2-9]") == {0: 57, 1: 9}
    assert mariadb.mariadb_gtid_domains("0-1-57,0-2-60") == {0: 60}
    assert mariadb.mariadb_gtid_domains("[]") == {}


@pytest.mark.parametrize(("purged", "read", "missing"), [
    ("", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", ""),
    ("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-9", ""),
    ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:8", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-3,\naa:1",
     "3e11fa47-71ca-11e1-9e33-c80aa9429562:4-5,3e11fa47-71ca-11e1-9e33-c80aa9429562:8-8"),
    ("aa:1-4,bb:1-2", "aa:1-2:3-4", "bb:1-2"),
    ("aa:tag1:1-3", "aa:1-3", "aa:tag1:1-3"),
])
def test_mysql_gtids_purged_beyond_what_the_connector_read_are_named(purged: str, read: str, missing: str) -> None:
    assert mariadb.mysql_gtids_missing(purged, read) == missing


def test_a_reader_without_its_binlog_file_yet_has_not_reached_a_position():
    # A reader started from a GTID position names no file until the server's first rotate event.
    assert not mariadb.position_reached({"file": "", "pos": 900}, {"file": "mariadb-bin.000001", "pos": 4})
    assert mariadb.position_reached({"file": "mariadb-bin.000002", "pos": 4}, {"file": "mariadb-bin.000001", "pos": 9})
