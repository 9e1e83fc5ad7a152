"""The destination tables as one run of a connector reads and claims them, and a DML step's destination prepared.

Read once per run: the tables' catalog (`CatalogCache`) and their claims (`table_owners`: the connector writes a
table alone) are read for all of a group's tables at once and kept for the run; a schema change forgets them, and so
does a transaction (or a savepoint, `savepoint`) that may have written them and was undone. A DML step's destination
(`PreparedDml`) is claimed, made to match the events' columns, and its columns planned before its rows move.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import psycopg

from cdc_pipeline.catalog import CatalogCache, DestinationTable
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.dml import ColumnPlan, plan_columns
from cdc_pipeline.convert.schema_infer import ensure_table_matches
from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sink.plan import DmlStep


@dataclass
class PreparedDml:
    """A DML step's destination, known before its rows move: the table (made to match the events' columns), the
    columns' plan, the transforms of the mapping rules and the primary key's columns (none: a keyless table)."""

    schema: str
    table: str
    destination: DestinationTable
    columns: list[ColumnPlan]
    transforms: dict[str, objmap.Transform]
    key: list[str]


class DestinationTables:
    """The destination tables one connector's applier writes: their names by the mapping rules, the run's reads of
    their catalog (`catalog`) and of their claims, forgotten at a schema change and when a transaction that may have
    changed them is undone (`forget`)."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, control_schema: str,
                 object_map: objmap.ObjectMap) -> None:
        self.conn = conn
        self.connector = connector
        self.control_schema = control_schema
        self.object_map = object_map
        self.catalog = CatalogCache()
        self._claimed: set[tuple[str, str]] = set()  # the destination tables this run claimed (`claim`)

    def names(self, source_table: str) -> tuple[str, str]:
        """The destination schema and table of a source table, by the mapping rules."""
        return self.object_map.table_name(source_table)

    def forget(self) -> None:
        """Forgets the catalog facts and claims read in this run: a transaction that wrote them was undone."""
        self.catalog.forget()
        self.forget_claims()

    def forget_claims(self) -> None:
        """Forgets the claims made in this run: a dropped or renamed table's claim was let go."""
        self._claimed.clear()

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint (under `skip`) whose rollback also forgets the run's reads: the table it altered or created,
        and its claims, are undone with it."""
        try:
            with self.conn.transaction():
                yield
        except BaseException:
            self.forget()
            raise

    def claim_all(self, cur: psycopg.Cursor, steps: list[DmlStep]) -> None:
        """`claim` of every step's table not claimed yet in this run, in one round."""
        wanted = [(*self.names(step.source_table), step.source_table) for step in steps]
        wanted = [(schema, table, source) for schema, table, source in wanted if (schema, table) not in self._claimed]
        rule_store.claim_tables(cur, self.control_schema, self.connector.name, wanted)
        self._claimed.update((schema, table) for schema, table, _ in wanted)

    def claim(self, cur: psycopg.Cursor, source_table: str, schema: str, table: str) -> None:
        """Makes sure the connector writes the destination table alone (once a run per table): a table another
        connector created, that a source without DDL events would find matching, is refused, not written."""
        if (schema, table) not in self._claimed:
            rule_store.claim_table(cur, self.control_schema, self.connector.name, schema, table, source_table)
            self._claimed.add((schema, table))

    def prepare_dml(self, cur: psycopg.Cursor, step: DmlStep) -> PreparedDml:
        """Claims the step's destination table, makes it match the events' columns, and plans its columns."""
        schema, table = self.names(step.source_table)
        position = step.last_ref.position if step.last_ref else None
        self.claim(cur, step.source_table, schema, table)
        destination = ensure_table_matches(
            cur, self.connector, schema, table, step.fields, source_table=step.source_table, position=position,
            object_map=self.object_map, catalog=self.catalog,
            on_change=lambda wanted: rule_store.record_columns(cur, self.control_schema, self.connector.name, wanted))
        columns = plan_columns(step.fields, destination.columns,
                               lambda name: self.object_map.column_name(step.source_table, name),
                               connector=self.connector.name, table=step.source_table,
                               dest_types=destination.types, position=position)
        columns, transforms = self.object_map.transforms(step.source_table, columns)
        key = list(destination.primary_key[1]) if destination.primary_key else []
        return PreparedDml(schema, table, destination, columns, transforms, key)
