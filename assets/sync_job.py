"""The fetch-cycle job of a connector: fetch -> parse -> convert DDL -> convert DML -> apply -> mark complete -> stats.

Fetch, parse and the conversions are lazy, as Spark's transformations are: each op adds its step to the stream
of batches, and the apply op drives it, one group of batches at a time, while the engine keeps capturing.
"""


from typing import Optional

from dagster import (
    JobDefinition,
    OpExecutionContext,
    Out,
    Output,
    graph,
    in_process_executor,
    mem_io_manager,
    op,
)

from assets.table_assets import cycle_materializations, log_spark_ui
from cdc_pipeline import cycle
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.ops.tables import count_applied
from resources.debezium_runner import DebeziumRunnerResource
from resources.replay import ReplayResource
from resources.spark_session import SparkSessionResource

CONNECTOR_TAG = "cdc/connector"
# Dagster's run retry tags (read by the daemon when the instance has run_retries enabled).
MAX_RETRIES_TAG = "dagster/max_retries"
RETRY_STRATEGY_TAG = "dagster/retry_strategy"
ALL_STEPS = "ALL_STEPS"


@op(description="Pops batches of change events from the Debezium engine (lazily) until the source is idle or "
                "the cycle's budget (max_events_per_run, max_seconds_per_run) is spent.")
def fetch_batches(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource):
    with debezium_runner.step() as session:
        log_spark_ui(context, session)
        return cycle.fetch_batches(session)


@op(description="Reads each batch's event index and parses its row images in Spark (lazily).")
def parse_events(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, batches):
    with debezium_runner.step() as session:
        return cycle.parse_batches(session, batches)


@op(description="Converts schema changes into destination DDL and splits each batch into DDL and DML steps "
                "in source order (lazily).")
def convert_ddl(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, parsed):
    with debezium_runner.step() as session:
        return cycle.convert_ddl(session, parsed)


@op(description="Gives each DML segment its rows (a Spark frame, lazily) and its columns from the batch's value "
                "schema. Each column's conversion is chosen when the segment applies, inside its batch's transaction, "
                "against the destination table as the batch's schema changes left it.")
def convert_dml(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, plans):
    with debezium_runner.step() as session:
        return cycle.convert_dml(session, plans)


@op(description="Applies each batch to the destination PostgreSQL in one transaction, with its applied position: "
                "its DDL, then per DML segment the column conversions and mapping rules (Spark), the compaction per "
                "key and the COPY and merge; drives the lazy steps before it, one group of batches at a time.")
def apply_batches(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, plans) -> list:
    with debezium_runner.step() as session:
        applied = cycle.apply_batches(session, count_applied(plans, debezium_runner.table_changes))
        counts = session.cycle_stats.counts
        context.log.info(f"applied {session.cycle_stats.batches} batches: {counts.events} events, "
                         f"{counts.ddls} schema changes")
        return applied


@op(description="Marks applied batches complete, so the Debezium offset advances past them.")
def mark_batches_complete(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource,
                          applied: list) -> int:
    with debezium_runner.step() as session:
        return cycle.mark_batches_complete(session, applied)


@op(description="Records the cycle's numbers as a materialization of the connector's asset, and of each table "
                "asset the cycle changed (its changes by kind, rows and applied position).",
    out=Out(dict))
def record_stats(context: OpExecutionContext, debezium_runner: DebeziumRunnerResource, marked: int):
    with debezium_runner.step() as session:
        summary = cycle.cycle_summary(session, marked)
        yield from cycle_materializations(session, summary, debezium_runner.table_changes)
        yield Output(summary)


@graph
def sync_cycle():
    batches = fetch_batches()
    parsed = parse_events(batches)
    plans = convert_dml(convert_ddl(parsed))
    applied = apply_batches(plans)
    return record_stats(mark_batches_complete(applied))


def build_sync_job(connector: ConnectorConfig, config_path: Optional[str] = None,
                   spark: Optional[SparkSessionResource] = None) -> JobDefinition:
    """The `sync_<name>` job of one connector: one run is one fetch cycle, in one process; run config
    `resources: {replay: {config: {start_offset: ...}}}` replays from an offset."""
    spark = spark or SparkSessionResource(config_path=config_path)
    replay = ReplayResource.configure_at_launch()
    return sync_cycle.to_job(
        name=f"sync_{connector.name}",
        description=f"One fetch cycle of connector {connector.name} ({connector.type} {connector.hostname}:"
                    f"{connector.port}/{connector.database}) into PostgreSQL.",
        resource_defs={
            "debezium_runner": DebeziumRunnerResource(connector=connector.name, config_path=config_path, spark=spark,
                                                      replay=replay),
            "replay": replay,
            "io_manager": mem_io_manager,
        },
        executor_def=in_process_executor,
        tags={CONNECTOR_TAG: connector.name, **run_retry_tags(connector)},
    )


def run_retry_tags(connector: ConnectorConfig) -> dict[str, str]:
    """Dagster's run retry tags matching the connector's `run_retries` (by default 2 under error_strategy retry,
    else 0, whatever the instance's default): a retry runs every step again, since the engine lives in the run."""
    tags = {MAX_RETRIES_TAG: str(connector.run_retries)}
    if connector.run_retries:
        tags[RETRY_STRATEGY_TAG] = ALL_STEPS
    return tags
