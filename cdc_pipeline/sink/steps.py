"""The per-step path: one step of a plan applied on its own, in its place: a schema change's DDL (its table renamed
first, a dropped source database's tables dropped, the record of what each column became), a TRUNCATE, the snapshot's
bookkeeping (an earlier snapshot superseded, a table emptied before its snapshot rows, the snapshot's end), and a
DML step (`dml_step`). Every table it writes is claimed first (`DestinationTables.claim`).
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from cdc_pipeline import control
from cdc_pipeline.catalog import destination_table
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.ddl import (
    DROP_DATABASE,
    DdlChange,
    alter_table_sql,
    create_table_sql,
    drop_table_sql,
    rename_table_sql,
)
from cdc_pipeline.decode.events import EventRef
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.mapping import rule_store
from cdc_pipeline.sink import deferred_keys
from cdc_pipeline.sink.destination_tables import DestinationTables
from cdc_pipeline.sink.dml_step import DmlStepPath
from cdc_pipeline.sink.plan import (
    SNAPSHOT_END,
    SNAPSHOT_RESTART,
    BatchPlan,
    DdlStep,
    DmlStep,
    SnapshotStep,
    TruncateStep,
    snapshot_reads,
)
from cdc_pipeline.sources import captures

log = logging.getLogger(__name__)


class StepPath:
    """Applies a plan's steps one at a time, each on its own path."""

    def __init__(self, connector: ConnectorConfig, control_schema: str, tables: DestinationTables,
                 dml: DmlStepPath) -> None:
        self.connector = connector
        self.control_schema = control_schema
        self.tables = tables
        self.dml = dml

    def apply(self, cur: psycopg.Cursor, plan: BatchPlan, step: DdlStep | DmlStep | TruncateStep | SnapshotStep
              ) -> None:
        """Applies one step of the plan on its own path (a DML step's zero dates written as NULL counted)."""
        if isinstance(step, DdlStep):
            for change in step.changes:
                if change.kind == DROP_DATABASE:
                    self._drop_database(cur, change, step.ref)
                else:
                    self._apply_ddl(cur, change, step.ref)
        elif isinstance(step, TruncateStep):
            self._apply_truncate(cur, step)
        elif isinstance(step, SnapshotStep):
            self._apply_snapshot_step(cur, step)
        else:
            plan.counts.zero_dates += self.dml.apply(cur, step)

    @staticmethod
    def _rename_table(cur: psycopg.Cursor, change: DdlChange) -> list[sql.Composed]:
        """The rename of the table the change renames, when the old one exists and the new one does not yet."""
        if change.renamed_from is None:
            return []
        old_schema, old_name = change.renamed_from
        if destination_table(cur, old_schema, old_name) is None or destination_table(cur, change.schema, change.name):
            return []
        return rename_table_sql(old_schema, old_name, change.name,
                                new_schema=change.schema if change.schema != old_schema else None)

    def _apply_truncate(self, cur: psycopg.Cursor, step: TruncateStep) -> None:
        schema, table = self.tables.names(step.source_table)
        if self.tables.catalog.table(cur, schema, table) is None:
            log.warning("TRUNCATE of %s: destination table %s.%s does not exist", step.source_table, schema, table)
            return
        self.tables.claim(cur, step.source_table, schema, table)
        cur.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.Identifier(schema, table)))
        log.info("Applied TRUNCATE of %s at %s", step.source_table, step.ref.position)

    def _apply_snapshot_step(self, cur: psycopg.Cursor, step: SnapshotStep) -> None:
        """Supersedes an earlier snapshot, replaces a table's rows before its snapshot rows, or ends a snapshot."""
        name, schema = self.connector.name, self.control_schema
        if step.kind == SNAPSHOT_RESTART:
            moved = control.supersede_snapshot(cur, schema, name)
            if moved.events:
                log.info("%s: the snapshot starts again at %s; the %d events applied of the earlier one (%d rows) are "
                         "counted as re-delivered and its tables replaced", name, step.ref.position, moved.events,
                         moved.snapshot_rows)
        elif step.kind == SNAPSHOT_END:
            for source_table in control.tables_not_replaced_by_snapshot(cur, schema, name):
                if captures(self.connector, source_table) and snapshot_reads(self.connector, source_table):
                    self._empty_for_snapshot(cur, source_table, step.ref, "the snapshot read no rows of it")
        else:
            if step.counts.snapshot_rows and control.replace_snapshot_rows(cur, schema, name, step.source_table):
                self._empty_for_snapshot(cur, step.source_table, step.ref, "its snapshot rows replace its rows")
            control.record_snapshot_progress(cur, schema, name, step.source_table, step.counts)

    def _empty_for_snapshot(self, cur: psycopg.Cursor, source_table: str, ref: EventRef, reason: str) -> None:
        schema, table = self.tables.names(source_table)
        if self.tables.catalog.table(cur, schema, table) is None:
            return
        self.tables.claim(cur, source_table, schema, table)
        try:
            cur.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.Identifier(schema, table)))
        except psycopg.Error as exc:
            raise ConversionError(f"cannot empty {schema}.{table} for the snapshot: {exc}",
                                  connector=self.connector.name, table=source_table, position=ref.position) from exc
        log.info("%s: emptied %s.%s (%s) at %s", self.connector.name, schema, table, reason, ref.position)

    def _drop_database(self, cur: psycopg.Cursor, change: DdlChange, ref: EventRef) -> None:
        """A source database dropped: each destination table the connector writes of its tables is dropped, as a
        DROP TABLE of each would (their schema stays)."""
        database = change.source_table[:-1]
        tables = [table for table in rule_store.owned_source_tables(cur, self.control_schema, self.connector.name)
                  if self.connector.split_table(table)[0] == database]
        for source_table in tables:
            self._apply_ddl(cur, DdlChange("drop", None, *self.tables.names(source_table), source_table,
                                           change.ddl_text), ref)
        log.info("%s: database %s was dropped at %s: dropped the destination tables of its %d table(s)",
                 self.connector.name, database, ref.position, len(tables))

    def _apply_ddl(self, cur: psycopg.Cursor, change: DdlChange, ref: EventRef) -> None:
        # Before any statement: another connector's table is neither altered nor dropped.
        self.tables.claim(cur, change.source_table, change.schema, change.name)
        try:
            change = deferred_keys.follow_ddl(cur, self.control_schema, self.connector.name, change)
            if change.kind == "drop":
                statements = drop_table_sql(change.schema, change.name)
            elif change.table is None:
                return
            else:
                statements = self._rename_table(cur, change)
                for statement in statements:
                    cur.execute(statement)
                self.tables.catalog.forget()
                existing = destination_table(cur, change.schema, change.name)
                statements = create_table_sql(change.table) if existing is None else alter_table_sql(
                    change.table, existing.columns, existing_primary_key=existing.primary_key,
                    column_renames=change.column_renames, existing_defaults=existing.defaults,
                    existing_not_null=existing.not_null, existing_unique=existing.unique,
                    unique_dropped=change.unique_dropped, user_typed=existing.user_typed)
            self.tables.catalog.forget()
            for statement in statements:
                cur.execute(statement)
            self._record_columns(cur, change)
            # A dropped or renamed table's claim is let go (`_record_columns`): claim again from here on.
            self.tables.forget_claims()
            log.info("Applied %s of %s as %s.%s (%d statements) for %r at %s", change.kind, change.source_table,
                     change.schema, change.name, len(statements), change.ddl_text[:200], ref.position)
        except psycopg.Error as exc:
            raise ConversionError(f"cannot apply {change.kind} table ({change.ddl_text!r}): {exc}",
                                  connector=self.connector.name, table=change.source_table,
                                  position=ref.position) from exc

    def _record_columns(self, cur: psycopg.Cursor, change: DdlChange) -> None:
        """Keeps the record of what each source column became (for reloads of the rules and the attribute view)."""
        name, schema = self.connector.name, self.control_schema
        if change.previous_source_table is not None:
            rule_store.forget_columns(cur, schema, name, change.previous_source_table)
        if change.table is None:
            rule_store.forget_columns(cur, schema, name, change.source_table)
        else:
            rule_store.record_columns(cur, schema, name, change.table)
