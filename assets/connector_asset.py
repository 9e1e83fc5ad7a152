"""Each connector's asset `cdc/<name>` (every fetch cycle records a materialization of it with the cycle's numbers,
and the change sensor an observation of its lag) and its check: row counts of every replicated table, source
against destination."""


from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetKey,
    AssetSpec,
    MetadataValue,
    asset_check,
)

from cdc_pipeline.config import ConnectorConfig, load_config
from cdc_pipeline.ops.row_counts import compare_row_counts


def connector_asset_key(name: str) -> AssetKey:
    return AssetKey(["cdc", name])


def build_connector_asset(connector: ConnectorConfig, config_path: str) -> tuple[AssetSpec, AssetChecksDefinition]:
    """The connector's asset (materialized by its `sync_<name>` runs) and its row-count check."""
    key = connector_asset_key(connector.name)
    spec = AssetSpec(key=key, group_name=connector.name, kinds={"postgres", connector.type},
                     description=f"The tables connector {connector.name} replicates from {connector.type} "
                                 f"{connector.hostname}:{connector.port}/{connector.databases_text}; each sync_{connector.name} "
                                 "run records its numbers here.")

    @asset_check(asset=key, name="row_counts_match", blocking=False,
                 description="Counts the rows of every replicated table in the source and the destination; fails "
                             "with the tables that differ (run it when the connector has caught up).")
    def row_counts_match() -> AssetCheckResult:
        config = load_config(config_path)
        counts = compare_row_counts(config.connector(connector.name), config.destination)
        differing = [count for count in counts if not count.matches]
        metadata = {count.source_table: MetadataValue.text(
            f"source {count.source_rows}, destination "
            f"{'missing' if count.destination_rows is None else count.destination_rows}") for count in counts}
        metadata["tables"] = MetadataValue.int(len(counts))
        metadata["differing_tables"] = MetadataValue.json([count.source_table for count in differing])
        return AssetCheckResult(
            passed=not differing, severity=AssetCheckSeverity.ERROR, metadata=metadata,
            description=("row counts differ: " + ", ".join(
                f"{count.source_table} (source {count.source_rows}, destination "
                f"{'missing' if count.destination_rows is None else count.destination_rows})" for count in differing))
            if differing else f"{len(counts)} tables, same row counts")

    return spec, row_counts_match
