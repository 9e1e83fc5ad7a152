"""Each table asset's check `matches_source`: `cdc-pipeline verify` of the table (content by key-range hashes, the
differing keys named), run by the connector's `verify_<name>` job on its `verify_schedule` and, by the sensor
`verify_<name>_after_load` (for many connectors, the one `cdc_verify_after_loads`), once each bulk load has been
reconciled by the stream."""


import json
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import psycopg
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetChecksDefinition,
    AssetSelection,
    DagsterInvalidDefinitionError,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    RunRequest,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    multi_asset_check,
    sensor,
)

from cdc_pipeline.bulk_load import bookkeeping
from cdc_pipeline.config import ConnectorConfig, load_config
from cdc_pipeline.errors import CdcError, ConfigError
from cdc_pipeline.ops.tables import ReplicatedTable
from cdc_pipeline.ops.verify import TableReport, verify_connector
from assets.table_assets import table_asset_key
from resources.debezium_runner import PRIORITY_TAG
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

VERIFY_CHECK = "matches_source"
AFTER_LOAD_INTERVAL_SECONDS = 60
# The sensor of every connector's verify after its loads, with more than ONE_SENSOR_BEYOND_CONNECTORS connectors
# (assets/definitions.py).
AFTER_LOADS_SENSOR_NAME = "cdc_verify_after_loads"
# A verify run's place in Dagster's run queue: below the sync runs' (0).
VERIFY_PRIORITY = -1
LISTED_KEYS = 20  # keys of each kind a check's metadata names (the report of `cdc-pipeline verify` has them all)


@dataclass
class VerifyDefinitions:
    checks: AssetChecksDefinition
    job: JobDefinition
    schedule: ScheduleDefinition | None
    sensor: SensorDefinition


def build_verify_checks(connector: ConnectorConfig, tables: list[ReplicatedTable],
                        config_path: str) -> VerifyDefinitions | None:
    """The check `matches_source` of each of the connector's table assets, the job that runs them, its schedule
    (none when `verify_schedule` is null) and the sensor that runs them after a bulk load; None without tables."""
    if not tables:
        return None
    by_key = {table_asset_key(table): table for table in tables}

    @multi_asset_check(
        name=f"verify_{connector.name}_tables", can_subset=True,
        specs=[AssetCheckSpec(VERIFY_CHECK, asset=key, blocking=False, description=(
            f"Compares {table.source_table} in the source with this table, by key-range hashes of the values as the "
            "mapping rules write them (cdc-pipeline verify); fails naming the keys that differ. Differences seen "
            "while the source holds changes not yet applied are reported as unconfirmed, not as a failure."))
            for key, table in by_key.items()])
    def verify_tables(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        config = load_config(config_path)
        selected = {check.asset_key: by_key[check.asset_key] for check in context.selected_asset_check_keys
                    if check.asset_key in by_key}
        report = verify_connector(config.connector(connector.name), config.destination,
                                  tables=sorted({table.source_table for table in selected.values()}))
        reports = {table.source_table: table for table in report.tables}
        for key, table in selected.items():
            found = reports.get(table.source_table)
            if found is None:
                yield AssetCheckResult(asset_key=key, check_name=VERIFY_CHECK, passed=False,
                                       severity=AssetCheckSeverity.WARN,
                                       description=f"{table.source_table} was not compared: the connector no longer "
                                                   "replicates it")
                continue
            yield check_result(key, found, report.unconfirmed)

    job = define_asset_job(name=f"verify_{connector.name}", selection=AssetSelection.checks(verify_tables),
                           description=f"Verifies the tables of connector {connector.name} against its source "
                                       "(their checks matches_source).",
                           # After the sync runs in Dagster's queue: a change waits for no verify run to start.
                           tags={PRIORITY_TAG: str(VERIFY_PRIORITY)})
    return VerifyDefinitions(verify_tables, job, _schedule(connector, job, config_path),
                             _after_load_sensor(connector, job))


def check_result(key: Any, table: TableReport, unconfirmed: str | None) -> AssetCheckResult:
    """A table's verify report as its check's result: passed when equal, or when its differences are unconfirmed
    (the source holds changes not applied yet: a busy source raises no alarm); failed (ERROR) naming the keys."""
    summary = table.as_dict()
    metadata: dict[str, Any] = {
        "compared_by": MetadataValue.text(table.compared_by), "chunks": MetadataValue.int(table.chunks),
        "source_rows": MetadataValue.int(table.source_rows),
        "destination_rows": MetadataValue.int(table.destination_rows),
        "left_out": MetadataValue.json(summary["left_out"]),
        **{kind: MetadataValue.json(summary[kind][:LISTED_KEYS])
           for kind in ("missing_keys", "extra_keys", "changed_keys") if summary[kind]},
        **({"differing_ranges": MetadataValue.json(summary["differing_ranges"][:LISTED_KEYS])}
           if summary["differing_ranges"] else {}),
    }
    if not table.differs:
        left_out = f"; columns left out: {', '.join(summary['left_out'])}" if summary["left_out"] else ""
        return AssetCheckResult(asset_key=key, check_name=VERIFY_CHECK, passed=True, metadata=metadata,
                                description=f"same content in {table.chunks} chunks{left_out}")
    if table.error is not None:
        return AssetCheckResult(asset_key=key, check_name=VERIFY_CHECK, passed=False,
                                severity=AssetCheckSeverity.ERROR, metadata=metadata, description=table.error)
    counts = ", ".join(f"{len(summary[kind])} {kind.replace('_', ' ')}" for kind in
                       ("missing_keys", "extra_keys", "changed_keys") if summary[kind])
    if unconfirmed:
        metadata["unconfirmed"] = MetadataValue.text(unconfirmed)
        return AssetCheckResult(asset_key=key, check_name=VERIFY_CHECK, passed=True, metadata=metadata,
                                description=f"no difference confirmed: {counts or 'ranges'} differed while the "
                                            f"source held changes not yet applied ({unconfirmed})")
    return AssetCheckResult(asset_key=key, check_name=VERIFY_CHECK, passed=False, severity=AssetCheckSeverity.ERROR,
                            metadata=metadata, description=f"differs from the source: {counts or 'ranges'} "
                                                           f"(cdc-pipeline verify {table.source_table} --repair "
                                                           "copies them again)")


def _schedule(connector: ConnectorConfig, job: JobDefinition, config_path: str) -> ScheduleDefinition | None:
    if not connector.verify_schedule:
        return None
    try:
        return ScheduleDefinition(name=f"verify_{connector.name}_schedule", cron_schedule=connector.verify_schedule,
                                  job=job, default_status=DefaultScheduleStatus.RUNNING,
                                  description=f"Verifies connector {connector.name}'s tables on "
                                              f"'{connector.verify_schedule}' (verify_schedule).")
    except DagsterInvalidDefinitionError as exc:
        raise ConfigError(f"{config_path}: field 'verify_schedule' {connector.verify_schedule!r} is refused by "
                          f"Dagster: {exc}", connector=connector.name) from None


def _after_load_sensor(connector: ConnectorConfig, job: JobDefinition) -> SensorDefinition:
    @sensor(name=f"verify_{connector.name}_after_load", job=job, minimum_interval_seconds=AFTER_LOAD_INTERVAL_SECONDS,
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Verifies connector {connector.name}'s tables once each of its bulk loads has been "
                        "reconciled by the stream (its tables then show the source at one moment).")
    def verify_after_load(context: SensorEvaluationContext, destination: DestinationResource):
        try:
            with destination.connect() as conn:
                decision, cursor = _after_load(conn, destination.destination().control_schema, connector, job,
                                               context.cursor)
        except (psycopg.Error, CdcError) as exc:
            return SkipReason(f"cannot read connector {connector.name}'s bulk loads: {exc}")
        if cursor is not None:
            context.update_cursor(cursor)
        return decision

    return verify_after_load


def build_after_loads_sensor(verified: list[tuple[ConnectorConfig, JobDefinition]]) -> SensorDefinition:
    """`cdc_verify_after_loads`: the sensors `verify_<name>_after_load` of many connectors as one (one tick of the
    daemon per pass, one connection to the destination), its cursor holding each connector's last verified load."""
    names = ", ".join(connector.name for connector, _ in verified)

    @sensor(name=AFTER_LOADS_SENSOR_NAME, jobs=[job for _, job in verified],
            minimum_interval_seconds=AFTER_LOAD_INTERVAL_SECONDS, default_status=DefaultSensorStatus.RUNNING,
            description=f"Verifies the tables of each of its {len(verified)} connectors ({names[:300]}) once each of "
                        "its bulk loads has been reconciled by the stream (its tables then show the source at one "
                        "moment).")
    def verify_after_loads(context: SensorEvaluationContext, destination: DestinationResource):
        cursors = json.loads(context.cursor) if context.cursor else {}
        requests, skips = [], []
        try:
            with destination.connect() as conn:
                schema = destination.destination().control_schema
                for connector, job in verified:
                    decision, cursor = _after_load(conn, schema, connector, job, cursors.get(connector.name))
                    if cursor is not None:
                        cursors[connector.name] = cursor
                    if isinstance(decision, RunRequest):
                        requests.append(decision)
                    else:
                        skips.append(decision.skip_message)
        except (psycopg.Error, CdcError) as exc:
            return SkipReason(f"cannot read the bulk loads of connectors {names[:300]}: {exc}")
        return SensorResult(run_requests=requests or None, cursor=json.dumps(cursors),
                            skip_reason=None if requests else SkipReason(
                                f"no bulk load of its {len(verified)} connectors reconciled since their last verify"))

    return verify_after_loads


def _after_load(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, job: JobDefinition,
                cursor: str | None) -> tuple[RunRequest | SkipReason, str | None]:
    """A verify run of the connector when a bulk load of it was reconciled since the one `cursor` names, with the new
    cursor; else a skip (and None)."""
    load_id = bookkeeping.reconciled_load(conn, schema, connector.name)
    if load_id is None or str(load_id) == cursor:
        return SkipReason(f"no bulk load of connector {connector.name} reconciled since the last verify"), None
    return RunRequest(run_key=f"verify-{connector.name}-load-{load_id}", job_name=job.name), str(load_id)
