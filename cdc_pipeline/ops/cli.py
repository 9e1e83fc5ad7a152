"""The `cdc-pipeline` command: check a connector's source and destination before its first run; run a fetch cycle
of a connector (the steps of its Dagster job, in this process and without Dagster); ask a connector to pause,
resume, move its offset, restart or reload its rules; show its state, requests and stats; verify its tables."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import psycopg

from cdc_pipeline import control, run_progress, sources
from cdc_pipeline.bulk_load import bookkeeping

from cdc_pipeline.mapping import objmap, rule_store

from cdc_pipeline.ops import preflight, requests, stats
from cdc_pipeline.config import SNAPSHOT_MODES, THIRD_PARTY_WARNINGS_ENV, PipelineConfig, load_config
from cdc_pipeline.errors import CdcError, names_lost_position

log = logging.getLogger(__name__)


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


def run_sync(name: str, start_offset: str | None = None, linger: bool = False, spark: Any = None,
             cancelled: threading.Event | None = None, linger_yields: Any = None,
             watch: Any = None, stands: Any = None) -> dict[str, Any]:
    """Runs one fetch cycle of the connector in this process (the steps of its `sync_<name>` job, without
    Dagster); returns its summary. A connector with nothing to do, as the change check tells without a JVM
    (`pending.nothing_to_do`), runs no cycle: its summary counts nothing and says why; unless `stands` (a standing
    run's: the session's `stands`) says the run stands, as it streams on whether changes come or not.

    The connector's pending requests are served first, as the Dagster sensor serves them (a `restart NAME always`
    takes effect in this cycle). A connector's first cycle is checked before it starts (`preflight.require_ready`:
    it does not start when its source or the destination lacks a setting or privilege). With `start_offset` (a
    Debezium offset as JSON) the cycle replays from that offset. With `linger` its stream goes on while changes keep
    coming, as a Dagster run's does (the connector's `linger_seconds`). `spark` is a session (or `SparkStart`) to
    run it on, a pipeline server's warm one (default: one started now); once `cancelled` is set the cycle ends as a
    pause does; `linger_yields`, `stands` and `watch` go to `run_cycle`.
    """
    from cdc_pipeline.cycle import run_cycle  # Spark's import is paid by the commands that run a cycle only
    from cdc_pipeline.capture.spark import SparkStart

    config = load_config()
    connector = config.connector(name)
    served = serve_requests_of(config, name)
    if start_offset is None and not (stands is not None and stands()):
        from cdc_pipeline.ops import pending

        started = time.monotonic()
        try:
            idle = pending.nothing_to_do(connector, config.destination)
        except Exception as exc:  # noqa: BLE001 - the cycle meets the same trouble, and records it as a failure
            logging.getLogger(__name__).info("%s: the change check failed (%s); a cycle runs", name, exc)
            idle = None
        if idle is not None:
            return {"connector": name, "batches": 0, **control.BatchCounts().as_dict(),
                    "seconds": round(time.monotonic() - started, 3), "events_per_second": 0.0, "nothing_to_do": idle,
                    **served}
    # The driver JVM starts now; the checks and the engine's start run while Spark's session is being made.
    spark = SparkStart(config.spark) if spark is None else spark
    preflight.require_ready(connector, config.destination)
    return {**run_cycle(connector, config.destination, spark, start_offset=start_offset, linger=linger,
                        cancelled=cancelled, linger_yields=linger_yields, watch=watch, stands=stands), **served}


def serve_requests_of(config: PipelineConfig, name: str) -> dict[str, Any]:
    """Serves the connector's pending requests, oldest first, under the same rules as the Dagster sensor; returns
    them for the run's summary (`requests_served`, absent when none was pending)."""
    schema = config.destination.control_schema
    with config.destination.connect(name) as conn:
        try:
            pending = requests.read_requests(conn, schema, name, status=requests.PENDING)
        except psycopg.errors.UndefinedTable:
            return {}  # no control schema yet: nothing was asked
        if pending:
            control.ensure_control_schema(conn, schema)
        outcomes = [requests.serve_request(conn, schema, config, request) for request in pending]
    return {"requests_served": [{"id": outcome.request.id, "kind": outcome.request.kind,
                                 "argument": outcome.request.argument, "status": outcome.status,
                                 "reason": outcome.reason} for outcome in outcomes]} if outcomes else {}


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"connector {summary['connector']}: {summary['batches']} batches, {summary['events']} events "
        f"(ddl {summary['ddls']}, snapshot rows {summary['snapshot_rows']}, inserts {summary['inserts']}, "
        f"updates {summary['updates']}, deletes {summary['deletes']}, truncates {summary.get('truncates', 0)}, "
        f"other {summary['other_events']}, re-delivered and skipped {summary.get('redelivered', 0)}, "
        f"set aside as dead letters {summary.get('bad_events', 0)}) "
        f"in {summary['seconds']:.1f} s ({summary['events_per_second']:.0f} events/s)"
        + ("; the bulk snapshot goes on in the next run" if summary.get("bulk_snapshot_pending") else "")
        + (f"; nothing to do: {summary['nothing_to_do']}" if summary.get("nothing_to_do") else "")
        + ("; the run's budget was spent, the stream goes on in the next run" if summary.get("budget_spent")
           else "")
        + "".join(f"; served request {served['id']} ({served['kind']}{' ' + served['argument'] if served['argument'] else ''}"
                  f") first: {served['status']}, {served['reason']}" for served in summary.get("requests_served", ()))
    )


def _cmd_sync(args: argparse.Namespace) -> int:
    os.environ.setdefault("CDC_RUNNER_LOG_LEVEL", "INFO" if args.verbose else "WARN")
    if args.verbose:
        os.environ.setdefault(THIRD_PARTY_WARNINGS_ENV, "1")
    bar = _ProgressBar(args.name) if sys.stderr.isatty() and not args.json else None
    try:
        if bar is not None:
            bar.start()
        if args.verbose:
            logging.getLogger().setLevel(logging.INFO)
        held = _failure_hold(args.name)
        if held is not None and not names_lost_position(held, args.name):  # its own first line follows
            print(f"note: {held}; this sync, asked for by hand, tries again (its success resumes the connector)",
                  file=sys.stderr)
        from cdc_pipeline.ops.pipeline_server import served_sync

        summary = served_sync(args.name, start_offset=args.start_offset, linger=args.linger)
        if summary is None:
            summary = run_sync(args.name, start_offset=args.start_offset, linger=args.linger)
    except Exception as exc:  # the command's contract: any failure becomes one message and exit code 1
        cause = str(_root_cause(exc))
        # An error that begins with the connector (a position the source lost) is its own first line.
        print(cause if cause.startswith(f"connector {args.name!r}: ") else
              f"sync of connector {args.name!r} failed: {cause}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.stop()
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def _failure_hold(name: str) -> str | None:
    """Why the change sensor launches no run of the connector after a failed one, or None (also when the state
    cannot be read: the sync then fails with the reason)."""
    try:
        config = load_config()
        with _control_connection(config) as conn:
            state = control.read_state(conn, config.destination.control_schema, name)
        return control.failure_hold(state, config.connector(name))
    except (psycopg.Error, CdcError):
        return None


class _ProgressBar(threading.Thread):
    """A one-line progress bar of a running bulk snapshot on the terminal (stderr), read from the control schema
    once a second; prints nothing while no bulk snapshot runs."""

    WIDTH = 30

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True)
        self.name = name
        self._stopped = threading.Event()
        self._shown = False

    def run(self) -> None:
        try:
            config = load_config()
            conn = config.destination.connect()
        except CdcError:
            return
        with conn:
            while not self._stopped.wait(1.0):
                try:
                    tables = bookkeeping.read_progress(conn, config.destination.control_schema, self.name)
                except psycopg.Error:
                    continue  # the control schema is not there yet
                running = [table for table in tables if table["finished_at"] is None]
                if running:
                    self._show(running[0], len(tables) - len(running), len(tables))

    def _show(self, table: dict[str, Any], finished: int, tables: int) -> None:
        total, done = max(table["rows_total"], 1), table["rows_done"]
        filled = min(self.WIDTH, self.WIDTH * done // total)
        eta = f"ETA {table['eta_seconds']:.0f} s" if table["eta_seconds"] is not None else ""
        line = (f"bulk snapshot {finished + 1}/{tables} {table['source_table']} [{'#' * filled}"
                f"{'.' * (self.WIDTH - filled)}] {done:,}/~{total:,} rows {table['rows_per_second']:,.0f} rows/s {eta}")
        sys.stderr.write("\r" + line[:150].ljust(150))
        sys.stderr.flush()
        self._shown = True

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)
        if self._shown:
            sys.stderr.write("\n")


@contextmanager
def _control_connection(config: PipelineConfig) -> Iterator[psycopg.Connection]:
    conn = config.destination.connect()
    with conn:
        control.ensure_control_schema(conn, config.destination.control_schema)
        yield conn


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str, indent=2))


def _cmd_state(args: argparse.Namespace) -> int:
    config = load_config()
    if args.name:
        config.connector(args.name)
    with _control_connection(config) as conn:
        rows = control.read_states(conn, config.destination.control_schema, args.name)
        progress = bookkeeping.read_progress(conn, config.destination.control_schema, args.name)
        for row in rows:
            row["run_progress"] = run_progress.read_live(conn, config.destination.control_schema, row["connector"])
            row["paused_tables"] = control.paused_tables(conn, config.destination.control_schema, row["connector"])
    for row in rows:
        row["bulk_snapshot"] = [{key: value for key, value in table.items() if key != "connector"}
                                for table in progress if table["connector"] == row["connector"]]
    known = {row["connector"] for row in rows}
    for name, connector in config.connectors.items():
        if (args.name is None or name == args.name) and name not in known:
            rows.append({"connector": name, "connector_type": connector.type, "state": requests.NEVER_RUN})
    for row in rows:
        connector = config.connectors.get(row["connector"])
        if connector is not None and sources.module_for(connector.type).slot_status is not None:
            row["source_slot"] = _slot_status(connector)
    if not args.verbose:
        for row in rows:
            row.pop("jvm_memory", None)
    if args.json:
        _print_json(rows)
        return 0
    for row in rows:
        print(f"{row['connector']} ({row['connector_type']}): {row['state']}")
        for label, key in (("stage", "stage"), ("running cycle", "phase"),
                           ("next cycle's snapshot mode", "next_snapshot_mode"), ("last error", "last_error"),
                           ("failed runs in a row", "failures"), ("last failed at", "last_failed_at"),
                           ("next attempt at", "next_attempt_at"), ("applied position", "applied_position"), ("debezium offset", "debezium_offset"),
                           ("applied at", "applied_at"), ("updated at", "updated_at"), ("jvm memory", "jvm_memory")):
            if row.get(key) is not None and not (key == "failures" and not row[key]):
                value = row[key] if isinstance(row[key], str) else json.dumps(row[key], default=str)
                print(f"  {label}: {value}")
        if row.get("paused_tables"):
            print(f"  paused tables (their changes let go): {', '.join(row['paused_tables'])}")
        slot = row.get("source_slot")
        if slot and "retained_wal_bytes" in slot:
            print(f"  replication slot: {slot['slot']} retains {slot['retained_wal_bytes'] >> 20} MB of WAL "
                  f"(wal_status {slot['wal_status']}{', in use' if slot['active'] else ''})")
        elif slot:
            print(f"  replication slot: {slot.get('error', 'none yet')}")
        if slot and slot.get("warning"):
            print(f"  warning: {slot['warning']}")
        live = row.get("run_progress")
        if live:
            print(f"  running now, as of {live['age_seconds']:.1f} s ago (run started {live['run_started_at']}):")
            for line in run_progress.progress_lines(live):
                print(f"    {line}")
        if row.get("bulk_snapshot"):
            print("  bulk snapshot:")
            for line in bulk_snapshot_lines(row["bulk_snapshot"]):
                print(f"    {line}")
        if row.get("events") is not None:
            print(f"  totals: {row['batches']} batches, {row['events']} events, {row['ddls']} ddl, "
                  f"{row['snapshot_rows']} snapshot rows, {row['inserts']} inserts, {row['updates']} updates, "
                  f"{row['deletes']} deletes")
    return 0


# Past this many tables, `state` gives a load's totals and the tables still loading, not a line per table.
STATE_TABLES_LISTED = 10


def bulk_snapshot_lines(tables: list[dict[str, Any]], listed: int = STATE_TABLES_LISTED) -> list[str]:
    """A load's progress for `state`: a line per table, or, for more than `listed` tables, the totals and the
    tables not done yet (those furthest along first, `listed` at most)."""
    if len(tables) <= listed:
        return [bookkeeping.format_progress(table) for table in tables]
    done = [table for table in tables if table["finished_at"]]
    rows_done, rows_total = sum(int(table["rows_done"]) for table in tables), sum(int(table["rows_total"])
                                                                                 for table in tables)
    share = f" ({100 * rows_done // rows_total}%)" if rows_total else ""
    lines = [f"{len(done)} of {len(tables)} tables done, {rows_done:,} / {'' if len(done) == len(tables) else '~'}"
             f"{rows_total:,} rows{share}"]
    loading = sorted((table for table in tables if not table["finished_at"]),
                     key=lambda table: -int(table["rows_done"]))
    lines += [bookkeeping.format_progress(table) for table in loading[:listed]]
    if len(loading) > listed:
        lines.append(f"... and {len(loading) - listed} more tables not done")
    return lines


def _slot_status(connector: Any) -> dict[str, Any] | None:
    """The PostgreSQL source's slot of the connector, or what kept it from being read."""
    slot_status = sources.module_for(connector.type).slot_status
    assert slot_status is not None
    try:
        return slot_status(connector)
    except CdcError as exc:
        return {"error": str(exc)}


def _cmd_stats(args: argparse.Namespace) -> int:
    config = load_config()
    schema = config.destination.control_schema
    if args.name:
        config.connector(args.name)
    elif args.reset or args.tables or args.databases:
        raise CdcError("stats --reset, --tables and --databases need the connector's name")
    with _control_connection(config) as conn:
        if args.tables or args.databases:
            control.ensure_control_schema(conn, schema)
            per = stats.read_table_stats(conn, schema, config.connector(args.name), by_database=args.databases)
            if args.json:
                _print_json(per)
                return 0
            for row in per:
                counts = ", ".join(f"{name} {row[name]}" for name in control.TABLE_STAT_COUNTERS if row[name])
                what = f"{row['database']} ({row['tables']} tables)" if args.databases else row["source_table"]
                print(f"{what}: {counts or 'no changes'}; last applied {row['last_applied_at']}")
            if not per:
                print(f"no changes applied per table yet for connector {args.name}")
            return 0
        if args.reset:
            had_stats = stats.reset_stats(conn, schema, args.name)
            print(f"stats of connector {args.name} reset" if had_stats else f"connector {args.name} has no stats yet")
            return 0
        rows = stats.read_stats(conn, schema, args.name)
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no stats yet: no batch was applied" + (f" for connector {args.name}" if args.name else ""))
    for row in rows:
        print(f"{row['connector']}:")
        for key, label in stats.FIELDS:
            if row.get(key) is not None:
                print(f"  {label}: {row[key]}")
    return 0


def _request_argument(value: str | list[str]) -> str | None:
    return (",".join(value) or None) if isinstance(value, list) else value


def _submit(args: argparse.Namespace, kind: str, argument: str | None = None) -> int:
    config = load_config()
    config.connector(args.name)
    schema = config.destination.control_schema
    with _control_connection(config) as conn:
        request_id = requests.submit_request(conn, schema, args.name, kind, argument)
        deadline = time.monotonic() + args.wait
        while True:
            request = requests.read_request(conn, schema, request_id)
            assert request is not None
            if request.status != requests.PENDING or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    if request.status == requests.PENDING:
        print(f"request {request_id} ({kind} {args.name}) is pending: the connector's next `cdc-pipeline sync "
              f"{args.name}` serves it first, or the Dagster sensor cdc_requests (or `cdc-pipeline requests --serve`); "
              f"`cdc-pipeline requests {args.name}` shows the outcome")
        return 0
    print(f"request {request_id} ({kind} {args.name}) {request.status}: {request.reason}")
    return 0 if request.status == requests.DONE else 3


def _cmd_requests(args: argparse.Namespace) -> int:
    config = load_config()
    if args.name:
        config.connector(args.name)
    schema = config.destination.control_schema
    with _control_connection(config) as conn:
        if args.serve:
            for outcome in requests.serve_pending_requests(conn, schema, config):
                print(f"served request {outcome.request.id} ({outcome.request.kind} {outcome.request.connector}): "
                      f"{outcome.status}: {outcome.reason}", file=sys.stderr if args.json else sys.stdout)
        rows = requests.read_requests(conn, schema, args.name, limit=args.limit)
    if args.json:
        _print_json([row.as_dict() for row in rows])
        return 0
    for row in rows:
        argument = f" {row.argument}" if row.argument else ""
        reason = f": {row.reason}" if row.reason else ""
        print(f"{row.id} {row.requested_at:%Y-%m-%d %H:%M:%S} {row.connector} {row.kind}{argument}: {row.status}{reason}")
    return 0


def _cmd_objmap(args: argparse.Namespace) -> int:
    config = load_config()
    schema = config.destination.control_schema
    connector = config.connector(args.name) if args.name else None
    # A rule that does not parse is refused before anything is stored.
    rule = objmap.parse_rule(connector, args.kind, args.source, args.destination) if args.action == "add" else None
    with config.destination.connect() as conn:
        control.ensure_control_schema(conn, schema)
        if rule is not None:
            rule_store.add_rule(conn, schema, connector, rule)
            print(f"{connector.name}: {rule.kind} {rule.source} -> {rule.destination} "
                  f"(in effect from the next fetch cycle, or now with `objmap reload`)")
        elif args.action == "del":
            if not rule_store.delete_rule(conn, schema, connector, args.kind, args.source):
                print(f"{connector.name}: no {args.kind} rule for {args.source}", file=sys.stderr)
                return 1
            print(f"{connector.name}: deleted the {args.kind} rule for {args.source}")
        elif args.action == "list":
            rows = rule_store.list_rules(conn, schema, args.name)
            if args.json:
                print(json.dumps(rows, default=str, indent=2))
            for row in [] if args.json else rows:
                print(f"{row['connector']}\t{row['kind']}\t{row['source_object']}\t{row['destination_object']}")
        elif args.action == "show":
            rows = rule_store.read_attributes(conn, schema, connector.name)
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
                object_map = rule_store.reload_mapping(conn, schema, connector)
            finally:
                control.release_run_lock(conn, connector.name)
            print(f"{connector.name}: the destination follows its {len(object_map.rules)} mapping rules")
    return 0


def _cmd_pending(args: argparse.Namespace) -> int:
    from cdc_pipeline.ops import pending

    config = load_config()
    names = [args.name] if args.name else list(config.connectors)
    found = {}
    for name in names:
        found[name] = pending.check(config.connector(name), config.destination)
        if not args.json:
            print(f"{name}: {'work' if found[name].work else 'no work'}: {found[name].reason}")
    if args.json:
        print(json.dumps({name: {"work": item.work, "reason": item.reason} for name, item in found.items()}))
    # Exit status 0 when some connector has work (a run would be launched), 1 when none has: usable in scripts.
    return 0 if any(item.work for item in found.values()) else 1


def _cmd_check(args: argparse.Namespace) -> int:
    config = load_config()
    names = [args.name] if args.name else list(config.connectors)
    reports = [preflight.check(config.connector(name), config.destination) for name in names]
    if args.json:
        _print_json([report.as_dict() for report in reports])
    else:
        print("\n".join(preflight.format_report(report) for report in reports))
    # Exit status 1 when an error-level finding exists: a first run would not start.
    return 1 if any(report.errors for report in reports) else 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdc_pipeline.ops.pipeline_server import SERVER_ENV, serve

    if args.stop:
        from cdc_pipeline.config import config_path
        from cdc_pipeline.ops import auto_server

        file_key = auto_server.file_key(str(config_path().resolve()))
        stopped = auto_server.stop_servers(auto_server.runtime_dir(), file_key)
        print(f"stopped {len(stopped)} pipeline server(s) started for the runs of this connectors file")
        return 0
    path = args.socket or os.environ.get(SERVER_ENV)
    if not path:
        print(f"error: give --socket PATH or set {SERVER_ENV}", file=sys.stderr)
        return 2
    os.environ.setdefault("CDC_RUNNER_LOG_LEVEL", "INFO" if args.verbose else "WARN")
    # Each cycle's INFO lines go to its client (which shows them with `sync -v`); here only with -v.
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in root.handlers:
        handler.setLevel(logging.INFO if args.verbose else logging.WARNING)
    return serve(Path(path), idle_exit_seconds=args.idle_exit)


def _cmd_bench(args: argparse.Namespace) -> int:
    from cdc_pipeline.testing.bench import main as bench_main

    return bench_main(args.bench_args)


CONFIG_HELP = "connectors file (default: $CDC_PIPELINE_CONFIG or dagster_home/connectors.yaml)"


def _config_option() -> argparse.ArgumentParser:
    """The parent parser of every subcommand: `--config` may follow the subcommand as well as precede it. Its
    default is SUPPRESS, so a subcommand without it keeps the value given before the subcommand."""
    option = argparse.ArgumentParser(add_help=False)
    option.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    return option


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc-pipeline", description=__doc__)
    parser.add_argument("--config", help=CONFIG_HELP)
    config = _config_option()
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", parents=[config], help="run one fetch cycle of a connector in this process "
                                                              "(its Dagster job's steps, without Dagster)")
    sync.add_argument("name")
    sync.add_argument("--json", action="store_true", help="print the summary as JSON")
    sync.add_argument("-v", "--verbose", action="store_true", help="show the run's log")
    sync.add_argument("--start-offset", metavar="JSON", help="replay from this Debezium offset (a backfill)")
    sync.add_argument("--linger", action="store_true",
                      help="once a change is applied, go on streaming until the connector's linger_seconds pass "
                           "without another, as a Dagster run does (default: end once caught up)")
    sync.set_defaults(handler=_cmd_sync)
    serve = commands.add_parser(
        "serve", parents=[config],
        help="a pipeline server: keeps the driver JVM and its Spark session warm and runs the fetch cycles of the "
             "`sync` processes whose CDC_PIPELINE_SERVER names its socket (token: CDC_PIPELINE_SERVER_TOKEN)")
    serve.add_argument("--socket", default=None,
                       help="the Unix socket to listen on (default: $CDC_PIPELINE_SERVER)")
    serve.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                       help="stop once no cycle has run for this long (default: run until stopped)")
    serve.add_argument("--stop", action="store_true",
                       help="stop the servers started for Dagster's runs of this connectors file (when none is "
                            "configured, see operations.md) instead of serving")
    serve.add_argument("-v", "--verbose", action="store_true", help="log each cycle's lines here too")
    serve.set_defaults(handler=_cmd_serve)
    check = commands.add_parser(
        "check", parents=[config],
        help="what the connector's source and the destination lack before a first run (settings, privileges), each "
             "with the statement that fixes it; exit status 1 on an error")
    check.add_argument("name", nargs="?")
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=_cmd_check)
    state = commands.add_parser("state", parents=[config],
                                help="show each connector's state, stage, running phase and offsets")
    state.add_argument("name", nargs="?")
    state.add_argument("--json", action="store_true")
    state.add_argument("-v", "--verbose", action="store_true", help="also the runner JVM's memory use")
    state.set_defaults(handler=_cmd_state)
    pending_command = commands.add_parser(
        "pending", parents=[config],
        help="whether each connector has work (changes at the source, a load to finish), as the change sensor checks "
             "it, without a JVM; exit status 0 if one has")
    pending_command.add_argument("name", nargs="?")
    pending_command.add_argument("--json", action="store_true")
    pending_command.set_defaults(handler=_cmd_pending)
    stats_command = commands.add_parser("stats", parents=[config],
                                        help="show each connector's cumulative stats, or reset them")
    stats_command.add_argument("name", nargs="?")
    stats_command.add_argument("--json", action="store_true")
    stats_command.add_argument("--reset", action="store_true", help="zero the named connector's stats")
    stats_command.add_argument("--tables", action="store_true", help="the named connector's changes per source table")
    stats_command.add_argument("--databases", action="store_true",
                               help="the named connector's changes per source database (schema)")
    stats_command.set_defaults(handler=_cmd_stats)
    request_commands = (
        ("pause", requests.PAUSE, "stop the connector's cycles (a running one ends at its next batch); with tables, "
                                  "let go of their changes alone while the others stream", "paused_tables"),
        ("resume", requests.RESUME, "resume a paused connector; with tables, copy them again and stream them",
         "paused_tables"),
        ("set-offset", requests.SET_OFFSET, "move a paused connector's Debezium offset (JSON)", "offset"),
        ("restart", requests.RESTART, "start the connector's engine again with a snapshot mode", "snapshot_mode"),
        ("reload-objmap", requests.RELOAD_OBJMAP, "re-read the connectors file and apply the mapping rules (renames, retypes)", None),
        ("snapshot", requests.SNAPSHOT, "copy tables again with the bulk snapshot engine (the others keep streaming)",
         "tables"),
    )
    for command, kind, help_text, argument in request_commands:
        sub = commands.add_parser(command, parents=[config], help=f"request: {help_text}")
        sub.add_argument("name")
        if argument == "snapshot_mode":
            sub.add_argument(argument, choices=SNAPSHOT_MODES)
        elif argument == "tables":
            sub.add_argument(argument, nargs="+", metavar="TABLE", help="db.table, or db.* for every table of a database")
        elif argument == "paused_tables":
            sub.add_argument(argument, nargs="*", metavar="TABLE",
                             help="db.table, or db.* for every table of a database (default: the whole connector)")
        elif argument:
            sub.add_argument(argument)
        sub.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait this long for the request to be served and print its outcome")
        sub.set_defaults(handler=lambda args, kind=kind, argument=argument: _submit(
            args, kind, _request_argument(getattr(args, argument)) if argument else None))
    listing = commands.add_parser("requests", parents=[config], help="list the latest requests with their outcome")
    listing.add_argument("name", nargs="?")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--serve", action="store_true",
                         help="first serve the pending requests here, as the Dagster sensor would (no run is launched)")
    listing.set_defaults(handler=_cmd_requests)
    objmap_parser = commands.add_parser("objmap", parents=[config],
                                        help="object mapping rules of a connector: add, del, list, show, reload")
    actions = objmap_parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", parents=[config],
                             help="add (or replace) a rule: KIND table|column|datatype|transform")
    add.add_argument("name")
    add.add_argument("kind")
    add.add_argument("source", help="db.table, db.table.column, or TYPE|autoincrement (datatype)")
    add.add_argument("destination", help="[schema.]table, column, pgtype|length, or a SQL expression with %%d")
    delete = actions.add_parser("del", parents=[config], help="delete a rule")
    delete.add_argument("name")
    delete.add_argument("kind")
    delete.add_argument("source")
    listing = actions.add_parser("list", parents=[config], help="list the rules (of one connector)")
    listing.add_argument("name", nargs="?")
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", parents=[config],
                              help="each source column beside its destination column, type and transform")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    reload = actions.add_parser("reload", parents=[config],
                                help="apply changed rules now: rename tables and columns, retype columns")
    reload.add_argument("name")
    objmap_parser.set_defaults(handler=_cmd_objmap)
    verify_command = commands.add_parser(
        "verify", parents=[config],
        help="compare a connector's tables in the source and the destination row by row (hashes of key ranges) and "
             "name the keys that differ; exit status 0 if equal, 1 if not, 3 if the connector has changes to apply")
    verify_command.add_argument("name")
    verify_command.add_argument("tables", nargs="*", metavar="TABLE",
                                help="db.table, or db.* for every table of a database (default: every table)")
    verify_command.add_argument("--repair", action="store_true",
                                help="copy the differing ranges again from the source (Spark, under the run lock)")
    verify_command.add_argument("--json", action="store_true", help="print the report as JSON")
    verify_command.add_argument("--every-table", action="store_true",
                                help="list every equal table too (of more than 10, they are counted)")
    verify_command.add_argument("--chunk-rows", type=int, default=10_000, metavar="N",
                                help="rows per compared key range (default 10000)")
    verify_command.add_argument("--rechecks", type=int, default=3, metavar="N",
                                help="times a differing row is read again before it is reported (default 3)")
    verify_command.add_argument("--recheck-seconds", type=float, default=5.0, metavar="SECONDS",
                                help="the wait before each recheck (default 5)")
    verify_command.set_defaults(handler=_cmd_verify)
    bench = commands.add_parser("bench", parents=[config], add_help=False,
                                help="measure capture and pipeline rates on throwaway servers (slow)")
    bench.set_defaults(handler=_cmd_bench)
    archive = commands.add_parser("jvm-archive", parents=[config],
                                  help="build the driver JVM's class archive, which shortens every run's start (make "
                                       "setup runs it)")
    archive.set_defaults(handler=_cmd_jvm_archive)
    _add_dead_letter_commands(commands, config)
    return parser


def _cmd_verify(args: argparse.Namespace) -> int:
    from cdc_pipeline.ops import verify

    config = load_config()
    connector = config.connector(args.name)
    spark = None
    if args.repair:
        from cdc_pipeline.capture.spark import build_spark_session

        spark = build_spark_session(config.spark)
    report = verify.verify_connector(connector, config.destination, spark, args.tables or None, args.repair,
                                     chunk_rows=args.chunk_rows, rechecks=args.rechecks,
                                     recheck_seconds=args.recheck_seconds)
    print(json.dumps(report.as_dict(), default=str, indent=2) if args.json
          else verify.format_report(report, every_table=args.every_table))
    return report.exit_code


def _cmd_jvm_archive(args: argparse.Namespace) -> int:
    from cdc_pipeline.capture import jvm_archive

    path, seconds = jvm_archive.build()
    print(f"JVM class archive {path} built in {seconds:.0f} s ({path.stat().st_size / 2**20:.0f} MB); runs map it "
          f"unless {jvm_archive.ARCHIVE_ENV}=off")
    return 0


def _add_dead_letter_commands(commands: Any, config: argparse.ArgumentParser) -> None:
    letters = commands.add_parser("dead-letters", parents=[config],
                                  help="events the skip error strategy set aside: list, show, retry (after fixing the "
                                       "cause) or discard them")
    actions = letters.add_subparsers(dest="action", required=True)
    for action, text in (("list", "list the connector's dead letters (pending ones unless --all)"),
                         ("show", "show dead letters whole: error, position, raw event"),
                         ("retry", "apply pending dead letters again, in order (all unless ids are given)"),
                         ("discard", "give up on dead letters (they stay listed as discarded)")):
        command = actions.add_parser(action, parents=[config], help=text)
        command.add_argument("name")
        command.add_argument("ids", nargs="*" if action in ("list", "retry") else "+", type=int)
        if action == "list":
            command.add_argument("--all", action="store_true", help="also retried and discarded ones")
        command.add_argument("--json", action="store_true")
        command.set_defaults(handler=_cmd_dead_letters)


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    from cdc_pipeline.ops import dead_letters

    config = load_config()
    connector = config.connector(args.name)
    schema = config.destination.control_schema
    with config.destination.connect() as conn:
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
        from cdc_pipeline.capture.spark import build_spark_session

        outcomes = dead_letters.retry(conn, build_spark_session(config.spark), connector, schema, args.ids or None)
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


def entry() -> None:
    """The `cdc-pipeline` command: `main`, then the process ends at once. Everything a command does is committed or
    closed by then, and the interpreter's own teardown (every module's objects, the JVM bridge's threads and sockets)
    would add about half a second to each `sync`; the driver JVM ends on its own once its standard input closes."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(0 if code is None else code)


if __name__ == "__main__":
    entry()
