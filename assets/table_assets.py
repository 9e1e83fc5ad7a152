"""Each replicated table as an asset keyed by its destination table, `AssetKey([schema, table])`, in its connector's
group beside the connector's asset `cdc/<name>`.

The tables are those the destination's control schema records for the connector (`cdc_pipeline/ops/tables.py`)
when the definitions load: a table a run creates or renames appears at the next reload. All of a connector's
assets are outputs of one graph, the stages of its fetch cycle (`assets/sync_job.py`), so `dagster asset
materialize --select` of any of them, the UI's Materialize, and a `sync_<name>` run each run a cycle, which
materializes the tables it changed (`cycle_materializations`). Each table has a freshness check, `fresh` (the
change sensor evaluates it).
"""

import logging
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

import psycopg
from dagster import (
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    MetadataValue,
)

from assets.source_assets import source_keys
from cdc_pipeline import control, cycle
from cdc_pipeline.config import ConnectorConfig, PipelineConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops.tables import ReplicatedTable, TableChanges, read_replicated_tables, read_table_status

log = logging.getLogger(__name__)

FRESH_CHECK = "fresh"
LAST_UPDATED = "dagster/last_updated_timestamp"
# How long the definitions wait for the destination when they load.
LOAD_CONNECT_TIMEOUT_SECONDS = 5


def table_asset_key(table: ReplicatedTable) -> AssetKey:
    return AssetKey([table.dest_schema, table.dest_table])


def load_replicated_tables(config: PipelineConfig) -> dict[str, list[ReplicatedTable]]:
    """Each connector's tables as the destination's control schema records them; none (logged, with why) when the
    destination cannot be read: the definitions then hold the connectors' assets only."""
    destination = config.destination
    try:
        with destination.connect(connect_timeout=LOAD_CONNECT_TIMEOUT_SECONDS) as conn:
            return read_replicated_tables(conn, destination.control_schema)
    except (psycopg.Error, CdcError) as exc:
        log.warning("the table assets are left out of the definitions: cannot read the control schema %s of the "
                    "destination: %s", destination.control_schema, str(exc).strip().splitlines()[0] if str(exc)
                    else type(exc).__name__)
        return {}


def table_spec(connector: ConnectorConfig, table: ReplicatedTable) -> AssetSpec:
    """The table's asset, downstream of its source tables' assets (`assets/source_assets.py`): of every source
    table a table rule merges into it."""
    sources = " and ".join(table.source_tables)
    return AssetSpec(
        key=table_asset_key(table), group_name=connector.name, kinds={"postgres"}, skippable=True,
        deps=source_keys(connector, table),
        description=f"{table.dest_schema}.{table.dest_table} in the destination, replicated by connector "
                    f"{connector.name} from {connector.type} table{'s' if table.merged_from else ''} {sources}.",
        metadata={"connector": connector.name, "source_table": table.source_table,
                  **({"merged_from": MetadataValue.json(list(table.merged_from))} if table.merged_from else {})})


def fresh_check_spec(connector: ConnectorConfig, table: ReplicatedTable) -> AssetCheckSpec:
    """The table's check `fresh`: passed by a run that materialized the table, evaluated by the change sensor."""
    return AssetCheckSpec(FRESH_CHECK, asset=table_asset_key(table), description=freshness_description(connector))


def freshness_description(connector: ConnectorConfig) -> str:
    return (f"Fails when the table was not brought up to date for {connector.freshness_minutes} minutes "
            "(freshness_minutes): by a run that changed it, or a change check that found the connector caught up. "
            f"Evaluated by the change sensor sync_{connector.name}_on_changes.")


def log_spark_ui(context: Any, session: cycle.ConnectorSession) -> None:
    """Names the run's Spark application and its web UI (when `spark: ui: true`) in the run's log."""
    spark_context = session.spark.sparkContext
    url = spark_context.uiWebUrl
    context.log.info(f"Spark application {spark_context.applicationId} ({spark_context.appName})"
                     + (f", web UI {url}" if url else ", web UI off (spark: ui: true)"))


def connector_metadata(session: cycle.ConnectorSession, summary: dict[str, Any]) -> dict[str, Any]:
    """The cycle's numbers for the connector's asset: its counts and timings, the runner JVM's memory, the bulk
    snapshot's progress per table, a PostgreSQL slot's retained WAL."""
    memory = session.memory_report()
    metadata: dict[str, Any] = {
        key: MetadataValue.int(value) if isinstance(value, int) else MetadataValue.float(float(value))
        for key, value in summary.items() if isinstance(value, (int, float))}
    metadata.update({f"jvm_{key}": MetadataValue.int(value) for key, value in memory.items()})
    for table in session.bulk_snapshot_progress():
        # Plotted per table by the asset's page while a bulk snapshot runs over several runs.
        prefix = f"bulk_snapshot/{table['source_table']}"
        metadata[f"{prefix}/rows_done"] = MetadataValue.int(int(table["rows_done"]))
        metadata[f"{prefix}/rows_total"] = MetadataValue.int(int(table["rows_total"]))
        metadata[f"{prefix}/rows_per_second"] = MetadataValue.float(float(table["rows_per_second"]))
    assert session.conn is not None
    consistent = control.consistent_as_of(session.conn, session.destination.control_schema, session.connector.name)
    if consistent is not None:
        metadata.update(consistency_metadata(consistent))
    slot = session.source_slot()
    if slot is not None:
        # A PostgreSQL source keeps the WAL after the slot's position: plotted, so that a growing one shows.
        metadata["source_slot/retained_wal_mb"] = MetadataValue.float(round(slot["retained_wal_bytes"] / 2**20, 1))
    return metadata


def consistency_metadata(consistent: dict[str, Any]) -> dict[str, Any]:
    """The source commit the destination is consistent as of (`control.consistent_as_of`), as metadata."""
    metadata: dict[str, Any] = {"consistent_as_of": MetadataValue.json(consistent["position"])}
    if consistent["source_time"] is not None:
        metadata["consistent_as_of_source_time"] = MetadataValue.timestamp(consistent["source_time"])
    return metadata


def cycle_materializations(session: cycle.ConnectorSession, summary: dict[str, Any], changes: TableChanges,
                           also: Iterable[str] = ()) -> list[AssetMaterialization]:
    """What a finished cycle materializes: the connector's asset, and each table the cycle changed, loaded in a bulk
    snapshot, or named in `also` (source tables), under its destination name as the control schema records it now
    (a table created or renamed by the cycle included)."""
    name = session.connector.name
    events = [AssetMaterialization(asset_key=["cdc", name], metadata=connector_metadata(session, summary),
                                   description=f"fetch cycle of connector {name}")]
    assert session.conn is not None
    schema = session.destination.control_schema
    # A destination table that merges several source tables is materialized once, with their counts added.
    replicated = {source: table for table in read_replicated_tables(session.conn, schema, name).get(name, [])
                  for source in table.source_tables}
    began = datetime.now(timezone.utc) - timedelta(seconds=float(summary.get("seconds", 0)))
    loading = {row["source_table"]: row for row in session.bulk_snapshot_progress()
               if row["finished_at"] is None or row["finished_at"] >= began}
    touched: dict[ReplicatedTable, list[str]] = {}
    for source_table in sorted((set(changes.tables()) | set(loading) | set(also)) & set(replicated)):
        touched.setdefault(replicated[source_table], []).append(source_table)
    status = read_table_status(session.conn, schema, name, touched)
    consistent_as = control.consistent_as_of(session.conn, schema, name)
    for table, source_tables in touched.items():
        counts = Counter()
        for source_table in source_tables:
            counts.update(changes.counts(source_table))
        load = next((loading[source] for source in source_tables if source in loading), None)
        metadata = table_metadata(dict(counts), status[table.source_table], load)
        # A table a bulk load still copies is not consistent with the source; one streamed is, as of the commit.
        consistent = load is None or load["finished_at"] is not None
        metadata["consistent"] = MetadataValue.bool(consistent)
        if consistent and consistent_as is not None:
            metadata.update(consistency_metadata(consistent_as))
        metadata["source_table"] = MetadataValue.text(", ".join(source_tables))
        events.append(AssetMaterialization(asset_key=table_asset_key(table), metadata=metadata,
                                           description=f"fetch cycle of connector {name}"))
    return events


def table_metadata(counts: dict[str, int], status: Any, load: dict[str, Any] | None) -> dict[str, Any]:
    """A table's materialization: the changes applied by kind, its rows (`dagster/row_count`), the connector's
    applied position, and its bulk snapshot's progress while one loads it."""
    metadata: dict[str, Any] = {kind: MetadataValue.int(count) for kind, count in counts.items()}
    if status.rows is not None:
        metadata["dagster/row_count"] = MetadataValue.int(status.rows)
        if status.rows_estimated:
            metadata["row_count_estimated"] = MetadataValue.bool(True)
    if status.applied_position is not None:
        metadata["applied_position"] = MetadataValue.json(status.applied_position)
    if status.applied_at is not None:
        metadata["applied_at"] = MetadataValue.timestamp(status.applied_at)
    if load is not None:
        metadata["bulk_snapshot/rows_done"] = MetadataValue.int(int(load["rows_done"]))
        metadata["bulk_snapshot/rows_total"] = MetadataValue.int(int(load["rows_total"]))
        metadata["bulk_snapshot/rows_per_second"] = MetadataValue.float(float(load["rows_per_second"]))
        metadata["bulk_snapshot/done"] = MetadataValue.bool(load["finished_at"] is not None)
    return metadata
