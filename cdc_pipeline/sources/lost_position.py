"""A connector's stored position that its source no longer holds: a MariaDB/MySQL binlog purged past it, a PostgreSQL
replication slot the server invalidated (`max_slot_wal_keep_size`) or that was dropped, SQL Server change tables the
cleanup job cleaned past it. The changes after that position are gone from the source, and only a new snapshot
recovers (`lost_position` of the source module finds it before the engine starts; the connector's `on_position_lost`
says whether the run then fails or takes the snapshot)."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_pipeline.errors import LOST_WORDS, PositionLostError


@dataclass(frozen=True)
class LostPosition:
    """What the source no longer holds: `position`, the connector's stored position as the source names it
    (`mariadb-bin.000003:1234 (GTID 0-1-57)`), and `held`, what the source holds instead, since when (`its oldest
    binlog is mariadb-bin.000007, which begins after GTID 0-1-60`)."""

    position: str
    held: str

    def first_line(self, connector: str) -> str:
        return (f"connector {connector!r}: {LOST_WORDS} {self.position}: "
                f"{self.held}; recover with `cdc-pipeline restart {connector} always`")

    def error(self, connector: str, engine_text: str | None = None) -> PositionLostError:
        """The run's error: the first line above; below it, what recovering costs, and the engine's own text when
        the engine met the loss."""
        cost = ("the changes made after that position are gone from the source: the new snapshot replaces every "
                "table's rows with the source's (on_position_lost: snapshot takes it without asking)")
        detail = cost + (f"\nthe Debezium engine failed: {engine_text}" if engine_text else "")
        return PositionLostError(self.first_line(connector), connector=connector, detail=detail)
