"""The `cdc-pipeline` command: run a fetch cycle through the connector's Dagster job, show connector state."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import psycopg

from cdc_pipeline import control, objmap
from cdc_pipeline.config import load_config
from cdc_pipeline.errors import CdcError

log = logging.getLogger(__name__)


def _use_project_dagster_home() -> None:
    """Runs started from the CLI go to the project's Dagster instance (so the UI shows them) unless one is set."""
    if "DAGSTER_HOME" not in os.environ and Path("dagster_home/dagster.yaml").is_file():
        os.environ["DAGSTER_HOME"] = str(Path("dagster_home").resolve())


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    while True:
        if isinstance(seen, CdcError):
            return seen
        nxt = getattr(seen, "user_exception", None) or seen.__cause__ or seen.__context__
        if nxt is None or nxt is seen:
            return exc
        seen = nxt


def run_sync(name: str, verbose: bool = False) -> dict[str, Any]:
    """Runs one fetch cycle of the connector through its `sync_<name>` job in this process; returns its summary."""
    from dagster import DagsterInstance

    from assets.sync_job import build_sync_job

    config = load_config()
    connector = config.connector(name)
    _use_project_dagster_home()
    instance = DagsterInstance.get() if "DAGSTER_HOME" in os.environ else DagsterInstance.ephemeral()
    job = build_sync_job(connector, str(config.path))
    run_config = {"loggers": {"console": {"config": {"log_level": "INFO" if verbose else "WARNING"}}}}
    result = job.execute_in_process(instance=instance, run_config=run_config, raise_on_error=True)
    return result.output_for_node("record_stats")


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"connector {summary['connector']}: {summary['batches']} batches, {summary['events']} events "
        f"(ddl {summary['ddls']}, snapshot rows {summary['snapshot_rows']}, inserts {summary['inserts']}, "
        f"updates {summary['updates']}, deletes {summary['deletes']}, truncates {summary.get('truncates', 0)}, "
        f"other {summary['other_events']}, re-delivered and skipped {summary.get('redelivered', 0)}) "
        f"in {summary['seconds']:.1f} s ({summary['events_per_second']:.0f} events/s)"
    )


def _cmd_sync(args: argparse.Namespace) -> int:
    os.environ.setdefault("CDC_RUNNER_LOG_LEVEL", "INFO" if args.verbose else "WARN")
    try:
        summary = run_sync(args.name, verbose=args.verbose)
    except Exception as exc:  # the command's contract: any failure becomes one message and exit code 1
        cause = _root_cause(exc)
        print(f"sync of connector {args.name!r} failed: {cause}", file=sys.stderr)
        return 1
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def _cmd_state(args: argparse.Namespace) -> int:
    config = load_config()
    if args.name:
        config.connector(args.name)
    with psycopg.connect(config.destination.dsn.reveal(), autocommit=True) as conn:
        control.ensure_control_schema(conn, config.destination.control_schema)
        rows = control.read_states(conn, config.destination.control_schema, args.name)
    known = {row["connector"] for row in rows}
    for name, connector in config.connectors.items():
        if (args.name is None or name == args.name) and name not in known:
            rows.append({"connector": name, "connector_type": connector.type, "state": "never run"})
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    for row in rows:
        print(f"{row['connector']} ({row['connector_type']}): {row['state']}")
        for label, key in (("last error", "last_error"), ("applied position", "applied_position"),
                           ("debezium offset", "debezium_offset"), ("applied at", "applied_at"),
                           ("updated at", "updated_at")):
            if row.get(key) is not None:
                value = row[key] if isinstance(row[key], str) else json.dumps(row[key], default=str)
                print(f"  {label}: {value}")
        if row.get("events") is not None:
            print(f"  totals: {row['batches']} batches, {row['events']} events, {row['ddls']} ddl, "
                  f"{row['snapshot_rows']} snapshot rows, {row['inserts']} inserts, {row['updates']} updates, "
                  f"{row['deletes']} deletes")
    return 0


def _cmd_objmap(args: argparse.Namespace) -> int:
    config = load_config()
    schema = config.destination.control_schema
    connector = config.connector(args.name) if args.name else None
    # A rule that does not parse is refused before anything is stored.
    rule = objmap.parse_rule(connector, args.kind, args.source, args.destination) if args.action == "add" else None
    with psycopg.connect(config.destination.dsn.reveal(), autocommit=True) as conn:
        control.ensure_control_schema(conn, schema)
        if rule is not None:
            objmap.add_rule(conn, schema, connector.name, rule)
            print(f"{connector.name}: {rule.kind} {rule.source} -> {rule.destination} "
                  f"(in effect from the next fetch cycle, or now with `objmap reload`)")
        elif args.action == "del":
            if not objmap.delete_rule(conn, schema, connector, args.kind, args.source):
                print(f"{connector.name}: no {args.kind} rule for {args.source}", file=sys.stderr)
                return 1
            print(f"{connector.name}: deleted the {args.kind} rule for {args.source}")
        elif args.action == "list":
            rows = objmap.list_rules(conn, schema, args.name)
            if args.json:
                print(json.dumps(rows, default=str, indent=2))
            for row in [] if args.json else rows:
                print(f"{row['connector']}\t{row['kind']}\t{row['source_object']}\t{row['destination_object']}")
        elif args.action == "show":
            rows = objmap.read_attributes(conn, schema, connector.name)
            if args.json:
                print(json.dumps(rows, default=str, indent=2))
            for row in [] if args.json else rows:
                transform = f"  transform {row['transform']}" if row["transform"] else ""
                print(f"{row['source_table']}.{row['source_column']} {row['source_type']} -> {row['dest_schema']}."
                      f"{row['dest_table']}.{row['dest_column']} {row['dest_type']}{transform}")
        else:
            # One fetch cycle of the connector at a time holds this lock; each cycle reloads the rules itself.
            control.acquire_run_lock(conn, connector.name)
            try:
                object_map = objmap.reload_mapping(conn, schema, connector)
            finally:
                control.release_run_lock(conn, connector.name)
            print(f"{connector.name}: the destination follows its {len(object_map.rules)} mapping rules")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from cdc_pipeline.bench import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc-pipeline", description=__doc__)
    parser.add_argument("--config", help="connectors file (default: $CDC_PIPELINE_CONFIG or dagster_home/connectors.yaml)")
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="run one fetch cycle of a connector, in process, through its Dagster job")
    sync.add_argument("name")
    sync.add_argument("--json", action="store_true", help="print the summary as JSON")
    sync.add_argument("-v", "--verbose", action="store_true", help="show the run's log")
    sync.set_defaults(handler=_cmd_sync)
    state = commands.add_parser("state", help="show each connector's state and offsets")
    state.add_argument("name", nargs="?")
    state.add_argument("--json", action="store_true")
    state.set_defaults(handler=_cmd_state)
    objmap_parser = commands.add_parser("objmap",
                                        help="object mapping rules of a connector: add, del, list, show, reload")
    actions = objmap_parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add (or replace) a rule: KIND table|column|datatype|transform")
    add.add_argument("name")
    add.add_argument("kind")
    add.add_argument("source", help="db.table, db.table.column, or TYPE|autoincrement (datatype)")
    add.add_argument("destination", help="[schema.]table, column, pgtype|length, or a SQL expression with %%d")
    delete = actions.add_parser("del", help="delete a rule")
    delete.add_argument("name")
    delete.add_argument("kind")
    delete.add_argument("source")
    listing = actions.add_parser("list", help="list the rules (of one connector)")
    listing.add_argument("name", nargs="?")
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="each source column beside its destination column, type and transform")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    reload = actions.add_parser("reload", help="apply changed rules now: rename tables and columns, retype columns")
    reload.add_argument("name")
    objmap_parser.set_defaults(handler=_cmd_objmap)
    bench = commands.add_parser("bench", help="measure capture and pipeline rates on throwaway servers (slow)",
                                add_help=False)
    bench.set_defaults(handler=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest
    elif rest:
        build_parser().error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.config:
        os.environ["CDC_PIPELINE_CONFIG"] = args.config
    try:
        return args.handler(args)
    except CdcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
