"""The fetch cycle of a connector as the graph that materializes its assets: fetch -> parse -> convert DDL ->
convert DML -> apply -> mark complete -> stats, and its `sync_<name>` job.

Fetch, parse and the conversions are lazy, as Spark's transformations are: each op adds its step to the stream
of batches, and the apply op drives it, one group of batches at a time, while the engine keeps capturing. The last
op, record_stats, yields the connector's asset `cdc/<name>` and each table asset the cycle changed, so a sensor or
schedule that launches `sync_<name>` is an automation of every one of the connector's assets.
"""


import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional

from dagster import (
    AssetCheckResult,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    GraphDefinition,
    GraphOut,
    MaterializeResult,
    MetadataValue,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    define_asset_job,
    graph,
    in_process_executor,
    mem_io_manager,
    op,
)

from assets.table_assets import (
    FRESH_CHECK,
    LAST_UPDATED,
    cycle_materializations,
    fresh_check_spec,
    log_spark_ui,
    table_asset_key,
    table_spec,
)
from cdc_pipeline import cycle
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.ops.tables import ReplicatedTable, TableChanges, count_applied
from resources.debezium_runner import CONNECTOR_TAG, ENGINE_OWN, ENGINE_TAG, DebeziumRunnerResource
from resources.replay import ReplayResource
from resources.spark_session import SparkSessionResource

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

# Dagster's run retry tags (read by the daemon when the instance has run_retries enabled).
MAX_RETRIES_TAG = "dagster/max_retries"
RETRY_STRATEGY_TAG = "dagster/retry_strategy"
ALL_STEPS = "ALL_STEPS"
# The stages hand each other lazy streams of batches: they stay in the run's memory (one process).
STAGE_IO_MANAGER = "cdc_stage_io_manager"


def sync_resources(config_path: Optional[str], spark: SparkSessionResource) -> dict[str, Any]:
    """The resources of every connector's cycle: the Debezium runner (connector-agnostic), the replay resource
    (run config `resources: {replay: {config: {start_offset: ...}}}` replays from an offset) and the stages'
    in-memory I/O manager."""
    replay = ReplayResource.configure_at_launch()
    return {
        "debezium_runner": DebeziumRunnerResource(config_path=config_path, spark=spark, replay=replay),
        "replay": replay,
        STAGE_IO_MANAGER: mem_io_manager,
    }


def build_sync_assets(connector: ConnectorConfig, connector_spec: AssetSpec,
                      tables: list[ReplicatedTable]) -> AssetsDefinition:
    """The connector's asset and its tables' assets (`table_spec`, each with its check `fresh`), materialized
    together by one fetch cycle: the graph `<name>_fetch_cycle` of the cycle's stages.

    Any subset can be selected (the UI's Materialize of one table): the whole cycle runs, as it must to apply the
    connector's changes in order; it materializes the tables it changed, and the selected ones whether changed or
    not. Other changed tables get runtime materializations."""
    table_specs = [table_spec(connector, table) for table in tables]
    outputs = _output_names([connector_spec.key, *(spec.key for spec in table_specs)])
    check_outputs = {f"{outputs[spec.asset_key]}__{spec.name}": spec
                     for spec in (fresh_check_spec(connector, table) for table in tables)}
    keys_by_output_name = {name: key for key, name in outputs.items()}
    return AssetsDefinition(
        node_def=_cycle_graph(connector, list(keys_by_output_name), list(check_outputs),
                              {table_asset_key(table): table.source_table for table in tables}),
        keys_by_output_name=keys_by_output_name,
        check_specs_by_output_name=check_outputs,
        specs=[connector_spec, *table_specs],
        can_subset=True,
    )


def build_sync_job(connector: ConnectorConfig, sync_assets: AssetsDefinition) -> "UnresolvedAssetJobDefinition":
    """The `sync_<name>` job of one connector: one run is one fetch cycle materializing its assets, in one
    process. Checks of the assets defined elsewhere (row counts, verify) stay out of it."""
    return define_asset_job(
        name=f"sync_{connector.name}",
        selection=AssetSelection.assets(sync_assets).without_checks() | AssetSelection.checks(sync_assets),
        description=f"One fetch cycle of connector {connector.name} ({connector.type} {connector.hostname}:"
                    f"{connector.port}/{connector.databases_text}) into PostgreSQL.",
        executor_def=in_process_executor,
        # A run starts a driver JVM of its own unless the change sensor found a pipeline server to serve it.
        tags={CONNECTOR_TAG: connector.name, ENGINE_TAG: ENGINE_OWN, **run_retry_tags(connector)},
    )


def run_retry_tags(connector: ConnectorConfig) -> dict[str, str]:
    """Dagster's run retry tags matching the connector's `run_retries` (by default 2 under error_strategy retry,
    else 0, whatever the instance's default): a retry runs every step again, since the engine lives in the run."""
    tags = {MAX_RETRIES_TAG: str(connector.run_retries)}
    if connector.run_retries:
        tags[RETRY_STRATEGY_TAG] = ALL_STEPS
    return tags


def _output_names(keys: Iterable[AssetKey]) -> dict[AssetKey, str]:
    """An op output name per asset key (letters, digits and `_`, unique, starting with a letter)."""
    names: dict[AssetKey, str] = {}
    for key in keys:
        base = "asset__" + re.sub(r"\W", "_", "__".join(key.path), flags=re.ASCII)
        name, suffix = base, 1
        while name in names.values():
            suffix += 1
            name = f"{base}_{suffix}"
        names[key] = name
    return names


def _cycle_graph(connector: ConnectorConfig, asset_outputs: list[str], check_outputs: list[str],
                 source_tables: Mapping[AssetKey, str]) -> GraphDefinition:
    """The cycle's stages as a graph of connector `connector`, whose last op yields the assets' and checks'
    outputs; `source_tables`: each table asset's source table. Each op's node is named by its stage, its definition
    `<name>__<stage>` (Dagster wants one definition per name among all the assets of a code location)."""
    name = connector.name
    outputs = [*asset_outputs, *check_outputs]
    stage_out = Out(io_manager_key=STAGE_IO_MANAGER)

    @op(name=f"{name}__fetch_batches", out=stage_out,
        description="Pops batches of change events from the Debezium engine (lazily) until the source is idle or "
                    "the cycle's budget (max_events_per_run, max_seconds_per_run) is spent.")
    def fetch_batches(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource):
        served = debezium_runner.served(name, context.log)
        if served is not None:
            # The whole cycle ran on the pipeline server; the steps after this one pass its outcome on.
            context.log.info(f"the cycle ran on the pipeline server at {served['served_by']}: "
                             f"{served['events']} events in {served['seconds']:.1f} s")
            return None
        with debezium_runner.step(name) as session:
            log_spark_ui(context, session)
            return cycle.fetch_batches(session)

    def lazy_stage(stage: str, engine_step: Callable[[Any, Any], Any], description: str) -> OpDefinition:
        @op(name=f"{name}__{stage}", out=stage_out, description=description)
        def run_stage(debezium_runner: DebeziumRunnerResource, batches):
            if debezium_runner.served_summary(name) is not None:
                return None
            with debezium_runner.step(name) as session:
                return engine_step(session, batches)

        return run_stage

    parse_events = lazy_stage("parse_events", cycle.parse_batches,
                              "Reads each batch's event index and parses its row images in Spark (lazily).")
    convert_ddl = lazy_stage("convert_ddl", cycle.convert_ddl,
                             "Converts schema changes into destination DDL and splits each batch into DDL and DML "
                             "steps in source order (lazily).")
    convert_dml = lazy_stage("convert_dml", cycle.convert_dml,
                             "Gives each DML segment its rows (a Spark frame, lazily) and its columns from the batch's "
                             "value schema. Each column's conversion is chosen when the segment applies, inside its "
                             "batch's transaction, against the destination table as the batch's schema changes left "
                             "it.")

    @op(name=f"{name}__apply_batches", out=stage_out,
        description="Applies each batch to the destination PostgreSQL in one transaction, with its applied position: "
                    "its DDL, then per DML segment the column conversions and mapping rules (Spark), the compaction "
                    "per key and the COPY and merge; drives the lazy steps before it, one group of batches at a time.")
    def apply_batches(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, plans) -> list:
        if debezium_runner.served_summary(name) is not None:
            return []
        with debezium_runner.step(name) as session:
            applied = cycle.apply_batches(session, count_applied(plans, debezium_runner.table_changes(name)))
            counts = session.cycle_stats.counts
            context.log.info(f"applied {session.cycle_stats.batches} batches: {counts.events} events, "
                             f"{counts.ddls} schema changes")
            return applied

    @op(name=f"{name}__mark_batches_complete", out=stage_out,
        description="Marks applied batches complete, so the Debezium offset advances past them.")
    def mark_batches_complete(debezium_runner: DebeziumRunnerResource, applied: list) -> int:
        served = debezium_runner.served_summary(name)
        if served is not None:
            return int(served.get("marked_events") or 0)
        with debezium_runner.step(name) as session:
            return cycle.mark_batches_complete(session, applied)

    @op(name=f"{name}__record_stats",
        out={output: Out(Nothing, is_required=False) for output in outputs},
        description="Records the cycle's numbers as a materialization of the connector's asset, and of each table "
                    "asset the cycle changed (its changes by kind, rows and applied position).")
    def record_stats(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, marked: int):
        selected = context.selected_asset_keys
        # A subset (one table materialized from the UI) shows the selected tables loaded, changed or not.
        also = [source_tables[key] for key in selected if key in source_tables] if context.assets_def.is_subset else []
        served = debezium_runner.served_summary(name)
        if served is not None:
            changes = TableChanges({table: Counter(counts) for table, counts in served["table_changes"].items()})
            events = cycle_materializations(debezium_runner.reader(name), served, changes, also)
        else:
            with debezium_runner.step(name) as session:
                summary = cycle.cycle_summary(session, marked)
                events = cycle_materializations(session, summary, debezium_runner.table_changes(name), also)
        yield from _asset_results(events, selected, context.selected_asset_check_keys)

    @graph(name=f"{name}_fetch_cycle", out={output: GraphOut() for output in outputs},
           description=f"One fetch cycle of connector {name}: whichever of its assets is selected, the cycle applies "
                       "every change of the connector's tables.")
    def fetch_cycle():
        batches = fetch_batches.alias("fetch_batches")()
        parsed = parse_events.alias("parse_events")(batches)
        plans = convert_dml.alias("convert_dml")(convert_ddl.alias("convert_ddl")(parsed))
        applied = apply_batches.alias("apply_batches")(plans)
        stats = record_stats.alias("record_stats")(mark_batches_complete.alias("mark_batches_complete")(applied))
        # One output is returned as its handle, several as a named tuple of them.
        return stats._asdict() if len(outputs) > 1 else {outputs[0]: stats}

    return fetch_cycle


def _asset_results(events: list[AssetMaterialization], selected: Any, selected_checks: Any) -> Iterator[Any]:
    """A cycle's materializations as the selected assets' results (with their `fresh` check passed, when
    selected: the run brought the table up to date), else as runtime materializations."""
    now = MetadataValue.timestamp(time.time())
    for event in events:
        if event.asset_key not in selected:
            yield event
            continue
        yield MaterializeResult(asset_key=event.asset_key, metadata=event.metadata)
        if any(check.asset_key == event.asset_key and check.name == FRESH_CHECK for check in selected_checks):
            yield AssetCheckResult(asset_key=event.asset_key, check_name=FRESH_CHECK, passed=True,
                                   metadata={LAST_UPDATED: now}, description="materialized by this run")
