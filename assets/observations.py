"""What the change sensor records at each check of its connector, a run launched or not: the connector's lag behind
its source (an observation of `cdc/<name>`), an observation of each table asset when the check found the
connector caught up (the destination holds the source's data as of then: `dagster/last_updated_timestamp`), and
each table's freshness check `fresh`, evaluated from the latest of those and of its materializations; and the
rows of its source tables' assets, as the source's catalog estimates them."""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetRecordsFilter,
    MetadataValue,
)

from assets.connector_asset import connector_asset_key
from assets.source_assets import source_asset_key
from assets.table_assets import FRESH_CHECK, LAST_UPDATED
from cdc_pipeline import sources
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.ops.pending import Pending
from cdc_pipeline.ops.tables import ReplicatedTable, estimated_source_rows
from cdc_pipeline.sources.change_check import SourceLag

log = logging.getLogger(__name__)

# A lag that stays the same is observed again after this long; one that changes, at once.
LAG_OBSERVATION_SECONDS = 60
# The tables of a connector that stays caught up are observed again after this long (at most a quarter of the
# freshness window), and a freshness result that stays the same is recorded again after this long.
TABLE_OBSERVATION_SECONDS = 300
# A connector's table observations and freshness results are evaluated again after this long at most (at most a
# quarter of the freshness window): each evaluation reads the instance's asset and check records, tens of ms of the
# code server's CPU, and the change sensor runs every few seconds for each connector.
TABLE_EVALUATION_SECONDS = 30
# When each connector's tables were last evaluated, per instance, in this process (the code server's sensors).
_evaluated_at: dict[tuple[str, str], float] = {}


def _instance_key(instance: Any) -> str:
    """What tells one Dagster instance from another in this process: its directory, else the object itself."""
    try:
        return str(instance.root_directory)
    except Exception:  # noqa: BLE001 - an instance without a local directory
        return f"instance-{id(instance)}"


def lag_observation(instance: Any, connector: ConnectorConfig, found: Pending,
                    lag: SourceLag | None) -> AssetObservation | None:
    """The connector's lag as an observation of its asset; None when it is the one observed last, less than
    LAG_OBSERVATION_SECONDS ago."""
    key = connector_asset_key(connector.name)
    metadata: dict[str, Any] = {"caught_up": MetadataValue.bool(found.caught_up),
                                "pending": MetadataValue.text(found.reason)}
    if lag is not None:
        metadata["lag_bytes"] = MetadataValue.int(lag.bytes)
        metadata["position"] = MetadataValue.text(lag.position)
        metadata["source_position"] = MetadataValue.text(lag.source_position)
        if lag.events is not None:
            metadata["lag_events"] = MetadataValue.int(lag.events)
            metadata["lag_events_capped"] = MetadataValue.bool(lag.events_capped)
    last = _latest_observation(instance, key)
    if last is not None and time.time() - last.timestamp < LAG_OBSERVATION_SECONDS:
        previous = last.asset_observation.metadata
        if all(previous.get(name) == metadata.get(name) for name in ("caught_up", "lag_bytes", "lag_events")):
            return None
    return AssetObservation(asset_key=key, metadata=metadata,
                            description=f"change check of connector {connector.name}: {found.reason}"[:500])


def table_events(instance: Any, connector: ConnectorConfig, keys: Sequence[AssetKey],
                 found: Pending | None) -> list[AssetObservation | AssetCheckEvaluation]:
    """The caught-up observations of the tables (when `found` says the connector is caught up, at most every
    TABLE_OBSERVATION_SECONDS), and the freshness results that changed, were recorded long ago, or precede the
    table's latest materialization; evaluated at most every TABLE_EVALUATION_SECONDS for a connector and an
    instance (none in between)."""
    if not keys:
        return []
    now = time.time()
    evaluated = (_instance_key(instance), connector.name)
    if now - _evaluated_at.get(evaluated, float("-inf")) < min(TABLE_EVALUATION_SECONDS,
                                                                 connector.freshness_minutes * 15):
        return []
    _evaluated_at[evaluated] = now
    every = min(TABLE_OBSERVATION_SECONDS, connector.freshness_minutes * 15)
    events: list[AssetObservation | AssetCheckEvaluation] = []
    last_observed = _caught_up_at(instance, keys)
    if found is not None and found.caught_up:
        if last_observed is None or now - last_observed >= every:
            events.extend(AssetObservation(
                asset_key=key, metadata={LAST_UPDATED: MetadataValue.timestamp(now)},
                description=f"connector {connector.name} has applied every change of its source") for key in keys)
        last_observed = now
    materialized = {key: entry.timestamp for key, entry in latest_materializations(instance, list(keys)).items()}
    previous = instance.event_log_storage.get_asset_check_summary_records(
        [AssetCheckKey(key, FRESH_CHECK) for key in keys])
    window = connector.freshness_minutes * 60
    for key in keys:
        updated = max(filter(None, (materialized.get(key), last_observed)), default=None)
        passed = updated is not None and now - updated <= window
        record = previous.get(AssetCheckKey(key, FRESH_CHECK))
        last = record.last_completed_check_execution_record if record is not None else None
        last_evaluation = last.event.asset_check_evaluation if last is not None and last.event is not None else None
        if last_evaluation is not None and last_evaluation.passed == passed \
                and now - last.event.timestamp < TABLE_OBSERVATION_SECONDS \
                and materialized.get(key, 0) < last.event.timestamp:
            # The same result, recent, and about the table's latest materialization.
            continue
        metadata: dict[str, Any] = {}
        if updated is not None:
            metadata[LAST_UPDATED] = MetadataValue.timestamp(updated)
        events.append(AssetCheckEvaluation(
            asset_key=key, check_name=FRESH_CHECK, passed=passed, severity=AssetCheckSeverity.WARN,
            metadata=metadata,
            description=(f"brought up to date within freshness_minutes ({connector.freshness_minutes})" if passed else
                         f"not brought up to date for more than {connector.freshness_minutes} minutes"
                         if updated is not None else "never brought up to date")))
    return events


def latest_materializations(instance: Any, keys: list[AssetKey]) -> dict[AssetKey, Any]:
    """Per asset, its latest materialization's event (its timestamp and its `asset_materialization`)."""
    return {record.asset_entry.asset_key: record.asset_entry.last_materialization_record.event_log_entry
            for record in instance.get_asset_records(keys)
            if record.asset_entry.last_materialization_record is not None}


def _latest_observation(instance: Any, key: AssetKey) -> Any:
    records = instance.fetch_observations(records_filter=AssetRecordsFilter(asset_key=key), limit=1).records
    return records[0].event_log_entry if records else None


def _caught_up_at(instance: Any, keys: Sequence[AssetKey]) -> float | None:
    """When the tables were last observed caught up (they are observed together: the first table tells)."""
    entry = _latest_observation(instance, keys[0])
    if entry is None:
        return None
    value = entry.asset_observation.metadata.get(LAST_UPDATED)
    return float(value.value) if value is not None else entry.timestamp


def source_row_observations(instance: Any, connector: ConnectorConfig,
                            tables: Sequence[ReplicatedTable]) -> list[AssetObservation]:
    """The rows of the source tables of the connector's `tables` (those of its definitions, whose source assets
    exist) as the source's catalog estimates them (`dagster/row_count`, with `row_count_estimated`), when it
    estimates them cheaply (the source's `estimated_rows`), at most every TABLE_OBSERVATION_SECONDS; none when the
    source does not answer (logged)."""
    if sources.module_for(connector.type).estimated_rows is None:
        return []
    keys = {source_table: source_asset_key(connector, source_table)
            for table in tables for source_table in table.source_tables}
    if not keys or not _source_rows_due(instance, list(keys.values())):
        return []
    try:
        estimates = estimated_source_rows(connector, keys)
    except Exception as exc:  # noqa: BLE001 - each source's driver raises its own errors; the estimate is only shown
        log.warning("cannot read the row estimates of connector %s's source tables: %s", connector.name, exc)
        return []
    return [AssetObservation(asset_key=keys[source_table],
                             metadata={"dagster/row_count": MetadataValue.int(rows),
                                       "row_count_estimated": MetadataValue.bool(True)},
                             description=f"rows of {source_table} as the {connector.type} catalog estimates them")
            for source_table, rows in sorted(estimates.items())]


def _source_rows_due(instance: Any, keys: list[AssetKey]) -> bool:
    """Whether the source tables were observed TABLE_OBSERVATION_SECONDS ago or more (they are observed together:
    the first one observed tells)."""
    for key in keys:
        last = _latest_observation(instance, key)
        if last is not None:
            return time.time() - last.timestamp >= TABLE_OBSERVATION_SECONDS
    return True
