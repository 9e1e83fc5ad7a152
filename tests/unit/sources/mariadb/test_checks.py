"""The MariaDB/MySQL change check's binlog scan, without a server: pages up to the end, its time budget, the first
event of the connector."""

from __future__ import annotations

import pytest

from cdc_pipeline.sources.mariadb import checks, scan_binlog


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
    monkeypatch.setattr(checks, "BINLOG_PAGE_EVENTS", 4)
    cursor = BinlogCursor({"bin.000001": _foreign(10), "bin.000002": _foreign(9) + [("Table_map",
                                                                                     "table_id: 5 (shop.items)")]})
    end = {"file": "bin.000002", "pos": 904}  # the captured change comes after the end: the next check's
    scan = scan_binlog(cursor, {"file": "bin.000001", "pos": 204}, end, _captured, _shop_ddl, 60)
    assert scan.found is None and scan.at_end and scan.reached == end
    assert scan.events == 8 + 9
    assert cursor.pages == [("bin.000001", 204, 4), ("bin.000001", 604, 4), ("bin.000001", 1004, 4),
                            ("bin.000002", 4, 4), ("bin.000002", 404, 4), ("bin.000002", 804, 4)]


def test_a_check_out_of_time_says_how_far_it_read_and_that_it_did_not_reach_the_end(monkeypatch):
    monkeypatch.setattr(checks, "BINLOG_PAGE_EVENTS", 4)
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
