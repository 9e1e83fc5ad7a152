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

from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.errors import CdcError

log = logging.getLogger(__name__)


def _use_project_dagster_home() -> None:
    """Runs started from the CLI go to the project's Dagster instance (so the UI shows them) unless one is set."""
    if "DAGSTER_HOME" not in os.environ and Path("dagster_home/dagster.yaml").is_file():
        os.environ["DAGSTER_HOME"] = str(Path("dagster_home").resolve())


def _root_cause(exc: BaseException) -> BaseException:
    """The pipeline's own error (CdcError) inside Dagster's wrappers and exception chains, else `exc` itself.

    Chains may loop (an exception raised while handling one that is already in its context): each exception is
    looked at once.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, CdcError):
            return current
        seen.add(id(current))
        current = getattr(current, "user_exception", None) or current.__cause__ or current.__context__
    return exc


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
        f"other {summary['other_events']}, re-delivered and skipped {summary.get('redelivered', 0)}, "
        f"set aside as dead letters {summary.get('bad_events', 0)}) "
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
    bench = commands.add_parser("bench", help="measure capture and pipeline rates on throwaway servers (slow)",
                                add_help=False)
    bench.set_defaults(handler=_cmd_bench)
    _add_dead_letter_commands(commands)
    return parser


def _add_dead_letter_commands(commands: Any) -> None:
    letters = commands.add_parser("dead-letters", help="events the skip error strategy set aside: list, show, "
                                  "retry (after fixing the cause) or discard them")
    actions = letters.add_subparsers(dest="action", required=True)
    for action, text in (("list", "list the connector's dead letters (pending ones unless --all)"),
                         ("show", "show dead letters whole: error, position, raw event"),
                         ("retry", "apply pending dead letters again, in order (all unless ids are given)"),
                         ("discard", "give up on dead letters (they stay listed as discarded)")):
        command = actions.add_parser(action, help=text)
        command.add_argument("name")
        command.add_argument("ids", nargs="*" if action in ("list", "retry") else "+", type=int)
        if action == "list":
            command.add_argument("--all", action="store_true", help="also retried and discarded ones")
        command.add_argument("--json", action="store_true")
        command.set_defaults(handler=_cmd_dead_letters)


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    from cdc_pipeline import dead_letters

    config = load_config()
    connector = config.connector(args.name)
    schema = config.destination.control_schema
    with psycopg.connect(config.destination.dsn.reveal(), autocommit=True) as conn:
        control.ensure_control_schema(conn, schema)
        if args.action in ("list", "show"):
            status = None if args.action == "show" or args.all else control.DEAD_LETTER_PENDING
            letters = control.read_dead_letters(conn, schema, connector.name, ids=args.ids or None, status=status)
            if args.json:
                print(json.dumps(letters, default=str, indent=2))
            for letter in [] if args.json else letters:
                print(f"{letter['id']}: {letter['status']} {letter['source_table']} op {letter['op']} at "
                      f"{json.dumps(letter['position'])} ({letter['created_at']:%Y-%m-%d %H:%M:%S}): "
                      + (letter["error"] if args.action == "show" else letter["error"].splitlines()[0][:160]))
                if args.action == "show":
                    print(f"  event: {letter['raw_event']}")
            if not letters and not args.json:
                print(f"connector {connector.name}: no {'pending ' if status else ''}dead letters")
            return 0
        if args.action == "discard":
            done = dead_letters.discard(conn, connector.name, schema, args.ids)
            print(f"connector {connector.name}: discarded {', '.join(map(str, done))}")
            return 0
        from cdc_pipeline.spark import build_spark_session

        outcomes = dead_letters.retry(conn, build_spark_session(), connector, schema, args.ids or None)
        print(f"connector {connector.name}: " + (f"applied dead letters {', '.join(str(i) for i, _ in outcomes)}"
                                                 if outcomes else "no pending dead letters"))
        return 0


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
