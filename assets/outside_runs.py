"""The `cdc_outside_runs` sensor: what a fetch cycle run outside Dagster (`cdc-pipeline sync`, a benchmark) wrote
becomes runless materializations of the connector's asset and of the tables it loaded or changed, with the
metadata a Dagster run records (`table_metadata`: rows, applied position). The engine imports no Dagster: the
sensor reads what the engine recorded in the control schema (`read_run_record`).

A table counts as written when its bulk load ended or its snapshot rows were applied after its latest
materialization, or when its write mark (`write_marks`: PostgreSQL's statistics of rows written) moved since the
sensor's last look and the connector's applied position is not the one its latest materialization records. A table
never materialized is materialized once the engine recorded anything of its connector. Nothing is recorded for a
connector while one of its Dagster runs is queued or running, or while any process holds its run lock: a run
materializes its tables at its end, and a cycle outside Dagster is looked at once it has ended.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import psycopg
from dagster import (
    AssetMaterialization,
    DefaultSensorStatus,
    MetadataValue,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.connector_asset import connector_asset_key
from assets.observations import latest_materializations
from assets.schedules import ACTIVE_RUN_STATUSES
from assets.table_assets import table_asset_key, table_metadata
from cdc_pipeline import control
from cdc_pipeline.bulk_load import bookkeeping
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops.tables import ReplicatedTable, RunRecord, read_run_record, read_table_status, write_marks
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

SENSOR_NAME = "cdc_outside_runs"
INTERVAL_SECONDS = 30
OUTSIDE_RUN = "fetch cycle run outside Dagster"


def build_outside_runs_sensor(connectors: Sequence[tuple[ConnectorConfig, str, Sequence[ReplicatedTable]]]
                              ) -> SensorDefinition:
    """`cdc_outside_runs`, every INTERVAL_SECONDS, for each (connector, its sync job's name, its tables).

    Its cursor holds, per connector, the tables' write marks at its last look."""

    @sensor(name=SENSOR_NAME, minimum_interval_seconds=INTERVAL_SECONDS, default_status=DefaultSensorStatus.RUNNING,
            description="Records what fetch cycles run outside Dagster (cdc-pipeline sync, a benchmark) wrote: a "
                        "materialization of the connector's asset and of each table they loaded or changed, read "
                        "from the control schema. Waits while a Dagster run of the connector or any cycle of it "
                        "runs.")
    def outside_runs(context: SensorEvaluationContext, destination: DestinationResource):
        marks = json.loads(context.cursor) if context.cursor else {}
        events: list[AssetMaterialization] = []
        waiting = []
        config = destination.destination()
        active = context.instance.get_runs(filters=RunsFilter(statuses=ACTIVE_RUN_STATUSES))
        for connector, job_name, tables in connectors:
            busy = _busy(active, connector, job_name, tables)
            if busy is None:
                try:
                    with config.connect(connector.name, connect_timeout=10) as conn:
                        if control.run_lock_held(conn, connector.name):
                            busy = f"a fetch cycle of connector {connector.name} is running"
                        else:
                            found, marks[connector.name] = outside_run_events(
                                context.instance, conn, config.control_schema, connector, tables,
                                marks.get(connector.name))
                            events.extend(found)
                except (psycopg.Error, CdcError) as exc:
                    log.warning("cannot read what connector %s's runs recorded: %s", connector.name, exc)
                    busy = f"the destination did not answer for connector {connector.name}"
            if busy is not None:
                waiting.append(busy)
        cursor = json.dumps(marks, sort_keys=True)
        if not events:
            return SensorResult(skip_reason=SkipReason("; ".join(waiting) or "no fetch cycle ran outside Dagster"),
                                cursor=cursor)
        return SensorResult(asset_events=events, cursor=cursor)

    return outside_runs


def _busy(active: Sequence[Any], connector: ConnectorConfig, job_name: str,
          tables: Sequence[ReplicatedTable]) -> str | None:
    """The connector's Dagster run in progress among the `active` runs (its sync job's, or one materializing its
    assets), or None."""
    keys = {connector_asset_key(connector.name), *(table_asset_key(table) for table in tables)}
    for run in active:
        if run.job_name == job_name or keys & set(run.asset_selection or ()):
            return f"run {run.run_id} of connector {connector.name} is {run.status.value.lower()}"
    return None


def outside_run_events(instance: Any, conn: psycopg.Connection, schema: str, connector: ConnectorConfig,
                       tables: Sequence[ReplicatedTable], seen: dict[str, str] | None
                       ) -> tuple[list[AssetMaterialization], dict[str, str]]:
    """The materializations of what the connector's cycles outside Dagster wrote since its assets' latest ones
    (`seen`: the tables' write marks at the last look, None at the first), and the marks now."""
    record = read_run_record(conn, schema, connector.name)
    marks = {f"{schema_name}.{table_name}": mark for (schema_name, table_name), mark in
             write_marks(conn, [(table.dest_schema, table.dest_table) for table in tables]).items()}
    if record.last_at is None:
        return [], marks
    latest = latest_materializations(instance, [table_asset_key(table) for table in tables])
    written = [table for table in tables
               if f"{table.dest_schema}.{table.dest_table}" in marks
               and _written(table, record, latest.get(table_asset_key(table)), seen, marks)]
    events = []
    status = read_table_status(conn, schema, connector.name, written)
    loads = {row["source_table"]: row for row in bookkeeping.read_progress(conn, schema, connector.name)}
    for table in written:
        metadata = table_metadata({}, status[table.source_table], next(
            (loads[source] for source in table.source_tables if source in loads), None))
        metadata["source_table"] = MetadataValue.text(", ".join(table.source_tables))
        events.append(AssetMaterialization(asset_key=table_asset_key(table), metadata=metadata,
                                           description=f"{OUTSIDE_RUN} of connector {connector.name}"))
    connector_event = _connector_event(instance, connector, record)
    if connector_event is not None:
        events.insert(0, connector_event)
    return events, marks


def _written(table: ReplicatedTable, record: RunRecord, latest: Any, seen: dict[str, str] | None,
             marks: dict[str, str]) -> bool:
    """Whether the engine wrote the table since its latest materialization `latest` (`outside_run_events`)."""
    if latest is None:
        return True
    loaded = [record.loaded_at[source] for source in table.source_tables if source in record.loaded_at]
    if loaded and max(loaded).timestamp() > latest.timestamp:
        return True
    name = f"{table.dest_schema}.{table.dest_table}"
    if seen is None or name not in seen or seen[name] == marks[name] or record.applied_at is None:
        return False
    applied_at = latest.asset_materialization.metadata.get("applied_at")
    return applied_at is None or abs(float(applied_at.value) - record.applied_at.timestamp()) > 1e-3


def _connector_event(instance: Any, connector: ConnectorConfig, record: RunRecord) -> AssetMaterialization | None:
    """The connector's asset, when the engine wrote after its latest materialization: the connector's running
    totals and its applied position."""
    key = connector_asset_key(connector.name)
    latest = latest_materializations(instance, [key]).get(key)
    assert record.last_at is not None
    if latest is not None and record.last_at.timestamp() <= latest.timestamp:
        return None
    metadata: dict[str, Any] = {f"total_{name}": MetadataValue.int(value) for name, value in record.totals.items()}
    if record.applied_position is not None:
        metadata["applied_position"] = MetadataValue.json(record.applied_position)
    metadata["last_written_at"] = MetadataValue.timestamp(record.last_at)
    return AssetMaterialization(asset_key=key, metadata=metadata,
                                description=f"{OUTSIDE_RUN} of connector {connector.name}: the connector's totals")
