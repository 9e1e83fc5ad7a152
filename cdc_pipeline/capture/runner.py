"""The Python half of the Debezium runner: properties, classpath, and the py4j bridge to the Java half.

All JVM-bridge code lives here. The Java half (``debezium_runner/``) runs inside the Spark driver JVM;
a popped batch's data changes stay a Java list of Spark rows (`UnsafeRow`) and become a DataFrame on the JVM
side, so events never pass through Python one by one, and Spark parses nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote, urlencode

from psycopg.conninfo import conninfo_to_dict
from py4j.protocol import Py4JError

from cdc_pipeline import sources
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError, RunnerError

log = logging.getLogger(__name__)

RUNNER_DIR = Path(__file__).resolve().parent / "debezium_runner"
RUNNER_JAR = RUNNER_DIR / "target" / "debezium-runner.jar"
RUNNER_LIB = RUNNER_DIR / "target" / "lib"
JAVA_PACKAGE = "io.cdcpipeline.runner"

# The runner parameter telling whether a batch keeps its records (`RunnerParameters.KEEP_RECORDS`).
KEEP_RECORDS_PROPERTY = "cdc.runner.keep.records"
OFFSETS_TABLE = "debezium_offsets"
SCHEMA_HISTORY_TABLE = "debezium_schema_history"

_JAR_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(?:-[A-Za-z0-9.]+)*\.jar$")


def build_runner(force: bool = False) -> Path:
    """Build the Java half with Maven unless its jar is already there; returns the jar's path."""
    if RUNNER_JAR.exists() and RUNNER_LIB.is_dir() and not force:
        return RUNNER_JAR
    log.info("Building the Debezium runner with Maven in %s", RUNNER_DIR)
    result = subprocess.run(
        ["mvn", "-q", "-B", "package", "-Dmaven.test.skip=true"], cwd=RUNNER_DIR, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RunnerError(f"Maven build of the Debezium runner failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return RUNNER_JAR


def _artifact_name(jar: Path) -> str:
    match = _JAR_ARTIFACT.match(jar.name)
    return match.group("artifact") if match else jar.stem


def spark_provided_artifacts() -> set[str]:
    """Artifact names of the Spark jars on the driver's classpath; the runner uses Spark's copy of each of them."""
    from cdc_pipeline.capture.spark_home import spark_jars

    return {_artifact_name(jar) for jar in spark_jars()}


# Debezium's words for a stored position its source no longer holds: a purged binlog (MariaDB's GTID state, a log
# file) or WAL, a replication slot gone or invalidated. The run's error then says so first (`PositionLostError`).
_LOG_PURGED = (r"no longer available on the server|could not find (first|next) log file|binlog .* (purged|not found)|"
               r"could not find GTID state requested|requested WAL segment .* has already been removed|"
               r"log files do not contain the offset scn")
_SLOT_LOST = r"replication slot .* does not exist|slot .* has been invalidated|can no longer get changes from replication slot"
_POSITION_LOST = re.compile(f"{_LOG_PURGED}|{_SLOT_LOST}", re.IGNORECASE)


def position_lost_failure(message: str | None) -> bool:
    """Whether an engine failure's message says the source no longer holds the connector's stored position."""
    return bool(message) and _POSITION_LOST.search(message) is not None


# Known causes of an engine failure, recognised in Debezium's message: (pattern, what to do).
_ENGINE_FAILURE_HINTS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(pattern, re.IGNORECASE), hint) for pattern, hint in (
    (r"access denied|password authentication failed|login failed|invalid username/password",
     "the source refused the connector's user or password: check `user` and the environment variable its "
     "`password` names"),
    (_LOG_PURGED,
     "the source no longer has the log at the stored offset (purged): take a new snapshot with `cdc-pipeline "
     "restart NAME always` (or `on_position_lost: snapshot`); the snapshot replaces each table's rows"),
    (_SLOT_LOST,
     "the replication slot is gone: take a new snapshot with `cdc-pipeline restart NAME always`"),
    (r"schema history .* (missing|corrupt)|db history topic (is missing|or its content is fully or partially missing)",
     "the schema history in the control schema is missing or incomplete: `cdc-pipeline restart NAME recovery` "
     "(its next run rebuilds the history from the tables as they are now and streams on from the stored offset; "
     "if a table's schema changed since that offset, remove the connector's offsets and take a new snapshot "
     "instead)"),
    (r"OutOfMemoryError",
     "the driver JVM's heap is too small for these values: raise spark.driver.memory in the connectors file's "
     "`spark: conf:`, or lower the connector's apply_batch_mb (docs/configuration.md, \"Memory\")"),
    (r"communications link failure|connection refused|unknown host|could not connect|unable to connect|"
     r"connect timed out|no route to host|name or service not known",
     "the source is not reachable: check that it runs and that `hostname` and `port` point at it from this "
     "machine"),
))


def failure_hint(message: str) -> str | None:
    """What to do about a failure to reach or read the source, when its message names a known cause."""
    return next((hint for pattern, hint in _ENGINE_FAILURE_HINTS if pattern.search(message)), None)


def engine_failure(message: str | None) -> str:
    """The error of a failed engine: Debezium's message, and what to do when its cause is a known one."""
    text = message or "no message"
    hint = failure_hint(text)
    return f"the Debezium engine failed: {text}" + (f"; what to do: {hint}" if hint else "")


def runner_classpath() -> list[Path]:
    """The runner jar and the dependency jars Spark does not already provide (Spark's version wins)."""
    if not RUNNER_JAR.exists():
        raise RunnerError(
            f"the Debezium runner is not built ({RUNNER_JAR} is missing): run 'make runner' or 'make demo'"
        )
    provided = spark_provided_artifacts()
    jars = [jar for jar in sorted(RUNNER_LIB.glob("*.jar")) if _artifact_name(jar) not in provided]
    return [RUNNER_JAR, *jars]


EXECUTOR_ARTIFACTS = ("mariadb-java-client", "postgresql")


def executor_jars() -> list[Path]:
    """The jars Spark's executors need for the bulk snapshot: the runner (its COPY writer) and the JDBC drivers of
    the source and the destination."""
    jars = [jar for jar in sorted(RUNNER_LIB.glob("*.jar")) if _artifact_name(jar) in EXECUTOR_ARTIFACTS]
    return [RUNNER_JAR, *jars]


# libpq DSN parameters pgjdbc takes under the same name and meaning.
_JDBC_PASSED_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout")


def jdbc_target(destination: DestinationConfig) -> tuple[str, str | None, str | None]:
    """The JDBC URL, user and password of the destination's libpq DSN (URI or conninfo): the JVM's connections
    (offsets, schema history, the bulk snapshot's COPY) get the DSN's TLS settings, the destination's lock and
    statement timeouts, and TCP keepalives, as the Python connections do."""
    params = conninfo_to_dict(destination.dsn.reveal())
    host = params.get("host") or "localhost"
    if host.startswith("/"):
        raise RunnerError("the destination DSN must name a TCP host (the Java stores use JDBC), not a socket directory")
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "postgres"
    query = {"tcpKeepAlive": "true", "options": destination.session_options}
    query.update({key: params[key] for key in _JDBC_PASSED_PARAMETERS if params.get(key)})
    if "connect_timeout" in query:
        query["connectTimeout"] = query.pop("connect_timeout")
    return (f"jdbc:postgresql://{host}:{port}/{quote(dbname, safe='')}?{urlencode(query, quote_via=quote)}",
            params.get("user"), params.get("password"))


SNAPSHOT_MODES = {
    "initial": "initial",
    "initial_only": "initial_only",
    "no_data": "no_data",
    "always": "always",
    "never": "never",
    "when_needed": "when_needed",
    # The schema history rebuilt from the tables as they are now (no rows), then streaming from the stored offset:
    # for a lost schema history, when no table changed its schema since that offset.
    "recovery": "recovery",
    # The destination tables only: the schema snapshot, no rows and no streaming (the connector then pauses for
    # review; resumed, it streams from the schema snapshot's position).
    "schemasync": "configuration_based",
}
SCHEMA_SYNC_PROPERTIES = {
    "snapshot.mode.configuration.based.snapshot.schema": "true",
    "snapshot.mode.configuration.based.snapshot.data": "false",
    "snapshot.mode.configuration.based.start.stream": "false",
}
# Snapshot modes after which the engine does not stream: a cycle ends once their snapshot is done.
NON_STREAMING_MODES = ("initial_only", "schemasync")


def debezium_properties(connector: ConnectorConfig, destination: DestinationConfig) -> dict[str, str]:
    """Every engine and connector property for one connector; the config's raw ``debezium`` map wins."""
    url, user, password = jdbc_target(destination)
    props: dict[str, str] = {
        "name": connector.name,
        "topic.prefix": connector.name,
        "database.hostname": connector.hostname,
        "database.port": str(connector.port),
        "database.user": connector.user,
        "database.password": connector.password.reveal(),
        "snapshot.mode": SNAPSHOT_MODES[connector.snapshot_mode],
        **(SCHEMA_SYNC_PROPERTIES if connector.snapshot_mode == "schemasync" else {}),
        "max.batch.size": str(connector.batch_size),
        "max.queue.size": str(max(8192, connector.batch_size * 4)),
        # ... and by bytes: events of multi-MB values would fill any heap at thousands an engine batch.
        "max.queue.size.in.bytes": str(connector.apply_batch_mb << 20),
        "poll.interval.ms": "100",
        "include.schema.changes": "true",
        # BEGIN and END records around each source transaction's changes: a group closes only at a source commit,
        # and a transaction larger than a group is applied in one destination transaction (`fetch_phases`).
        "provide.transaction.metadata": "true",
        "tombstones.on.delete": "false",
        "skipped.operations": "none",
        "decimal.handling.mode": "precise",
        "binary.handling.mode": "bytes",
        "time.precision.mode": "adaptive_time_microseconds",
        "record.processing.order": "ORDERED",
        "record.processing.threads": "1",
        "offset.storage": f"{JAVA_PACKAGE}.PostgresOffsetStore",
        "offset.flush.interval.ms": "0",
        "offset.flush.timeout.ms": "10000",
        "schema.history.internal": f"{JAVA_PACKAGE}.PostgresSchemaHistory",
        "schema.history.internal.store.only.captured.tables.ddl": "false",
        "errors.max.retries": "0",
        # How long the engine's stop waits for Debezium's threads before it interrupts them, and then again: a stop
        # takes 3-110 ms, but a data snapshot stopped with its queue full waits out both (8 s at Debezium's 4 s).
        "executor.shutdown.timeout.ms": "1000",
        # A batch keeps its records (not only their rows) for an event's whole line, which only a dead letter
        # needs: records in flight cost the JVM's collector far more than their rows (`ChangeBatch`).
        KEEP_RECORDS_PROPERTY: "true" if connector.error_strategy == "skip" else "false",
    }
    for prefix, table in (("offset.storage.cdc.", OFFSETS_TABLE), ("schema.history.internal.cdc.", SCHEMA_HISTORY_TABLE)):
        props[prefix + "jdbc.url"] = url
        if user:
            props[prefix + "jdbc.user"] = user
        if password:
            props[prefix + "jdbc.password"] = password
        props[prefix + "schema"] = destination.control_schema
        props[prefix + "table"] = table
        props[prefix + "connector"] = connector.name
    props.update(sources.module_for(connector.type).debezium_properties(connector))
    if connector.tables and "table.include.list" not in props:
        props["table.include.list"] = ",".join(re.escape(table) for table in connector.tables)
    props.update(connector.debezium)
    return props


def in_snapshot(entry: dict[str, Any]) -> bool:
    """Whether an index entry's record belongs to the connector's initial snapshot, as the runner decides where to
    cut a batch (`EventSerializer.inSnapshot`): its source block's `snapshot` (an incremental snapshot's reads are
    the stream's), else its offset taken inside a snapshot not completed."""
    source = entry.get("source") or {}
    if "snapshot" in source:
        return str(source["snapshot"]).lower() not in ("false", "none", "incremental")
    offset = entry.get("offset") or {}
    return str(offset.get("snapshot", "false")).lower() != "false" \
        and str(offset.get("snapshot_completed")).lower() != "true"


@dataclass
class FetchedBatch:
    """Events popped from the runner: the Java list of the rows Spark reads (data changes, row images only), the
    value schemas they use, and their index (one small dict an event, made by the runner: kind, table, op, source
    block, offset; see `EventRef`).

    Usually one runner batch; `merge_batches` joins consecutive small ones (kept in `members`),
    so that one Spark job and one transaction serve them all.
    """

    batch_id: int
    size: int
    java_batch: Any
    schemas: dict[str, Any]
    last_offset: dict[str, Any] | None
    last_partition: dict[str, Any] | None
    index: list[dict[str, Any]] = field(default_factory=list)
    java_data_rows: Any = None
    members: tuple["FetchedBatch", ...] = ()  # the runner batches a merged batch joins, in order
    bytes: int = 0  # about what its rows hold in the JVM (`ChangeBatch.bytes`)
    # A source transaction is open after its last event: its BEGIN came (in it or before it) and its END did not.
    transaction_open: bool = False

    @property
    def batch_ids(self) -> tuple[int, ...]:
        """The runner batch ids to mark complete once this is applied, in order."""
        return tuple(member.batch_id for member in self.members) or (self.batch_id,)

    @property
    def streamed(self) -> bool:
        """Whether the batch starts with a streamed record, not a snapshot's (the runner never hands over a batch
        that holds both the end of a snapshot and the start of the stream)."""
        return bool(self.index) and not in_snapshot(self.index[0])

    def data_rows(self) -> Any:
        """The Java list of the rows of data changes, all Spark reads (a py4j handle: they stay in the JVM).

        Each holds the event's seq, schema id, op and row images only (`ChangeBatch.rowType`); `line` gives an
        event's whole line."""
        return self.java_data_rows if self.java_data_rows is not None else self.java_batch.dataRows()

    def line(self, seq: int) -> str | None:
        """The whole JSON line of event `seq` (key, row images, source block, offset), which the runner makes
        only when asked; None when the batch has no runner behind it or no such event."""
        for batch in self.members or (self,):
            if batch.java_batch is not None:
                line = batch.java_batch.line(seq)
                if line is not None:
                    return str(line)
        return None


def java_class(jvm: Any, name: str) -> Any:
    """The Java class of the fully qualified `name`, in one py4j lookup. `jvm.java.util.ArrayList` asks the JVM for
    `java`, then `java.util`, then the class, and the JVM searches every jar of the driver's classpath for each name
    that is no class before it says so: per group of a stream, that took longer than the rest of its merge."""
    return getattr(jvm, name)


def merge_batches(batches: list[FetchedBatch], jvm: Any) -> FetchedBatch:
    """Joins consecutive batches into one; their rows are concatenated in the JVM, in order."""
    if len(batches) == 1:
        return batches[0]
    rows = java_class(jvm, "java.util.ArrayList")()
    schemas: dict[str, Any] = {}
    for batch in batches:
        rows.addAll(batch.data_rows())
        schemas.update(batch.schemas)
    return FetchedBatch(
        batch_id=batches[0].batch_id, size=sum(batch.size for batch in batches), java_batch=None, schemas=schemas,
        last_offset=batches[-1].last_offset, last_partition=batches[-1].last_partition,
        index=[entry for batch in batches for entry in batch.index], java_data_rows=rows,
        members=tuple(member for batch in batches for member in batch.members or (batch,)),
        bytes=sum(batch.bytes for batch in batches), transaction_open=batches[-1].transaction_open)


class DebeziumRunner:
    """One embedded Debezium engine inside the Spark driver JVM, driven through py4j."""

    def __init__(self, spark: Any, connector: str, properties: dict[str, str], queue_capacity: int = 4,
                 held_bytes: int = 0, failure_error: Callable[[str | None], CdcError] | None = None) -> None:
        self.connector = connector
        # The error a failed engine raises, made of Debezium's message (default: the message and what to do).
        self.failure_error = failure_error or (lambda text: RunnerError(engine_failure(text), connector=connector))
        self._spark = spark
        jvm = spark._jvm
        try:
            params = getattr(jvm, f"{JAVA_PACKAGE}.RunnerParameters")()
        except TypeError as exc:
            raise RunnerError(
                "the Debezium runner classes are not on the Spark driver classpath; the Spark session must be "
                "built by cdc_pipeline.capture.spark.build_spark_session before anything else starts a JVM",
                connector=connector,
            ) from exc
        for key, value in properties.items():
            params.set(key, str(value))
        params.setQueueCapacity(queue_capacity)
        params.setHeldBytes(held_bytes)
        self._java = getattr(jvm, f"{JAVA_PACKAGE}.DebeziumRunner")(params)
        self._started = False
        self._spool_dir: str | None = None

    def start(self) -> None:
        self._java.start()
        self._started = True

    def stop(self, timeout_seconds: float = 60.0) -> None:
        """Stops the engine (flushing the offsets of completed batches); does nothing if never started."""
        if self._spool_dir is not None:
            shutil.rmtree(self._spool_dir, ignore_errors=True)
            self._spool_dir = None
        if self._started:
            self._java.stop(int(timeout_seconds * 1000))
            self._started = False

    @property
    def state(self) -> str:
        return str(self._java.state())

    @property
    def last_error(self) -> str | None:
        error = self._java.lastError()
        return None if error is None else str(error)

    def is_polling(self) -> bool:
        return bool(self._java.isPolling())

    def is_streaming(self) -> bool:
        """True once the connector streams from the source (snapshot done, log reader connected)."""
        return bool(self._java.isStreaming())

    def snapshot_status(self) -> dict[str, bool]:
        """Debezium's snapshot metrics of this engine: `running`, `completed`, `aborted` ({} before they exist)."""
        return json.loads(self._java.snapshotStatus())

    def read_position(self) -> dict[str, Any] | None:
        """Where the engine's log reader is now (a binlog connector's file and position: past every event it handed
        to Debezium's queue, captured or not), or None when unknown."""
        return json.loads(self._java.readPosition()) or None

    def drained(self) -> bool:
        """Whether nothing the engine read is on its way to the runner: Debezium's queue and the runner's empty, no
        batch being handed over, and (MariaDB, MySQL) no record the engine took from its queue and still holds."""
        return bool(self._java.drained())

    def engine_queue_empty(self) -> bool:
        """Whether Debezium's own queue, between its source task and this runner, is empty now."""
        return bool(self._java.engineQueueEmpty())

    def waiting_for_room(self) -> bool:
        """Whether the engine's thread waits for batches held (queued, in flight) to be let go before it hands over
        the next one: they hold the runner's bound of bytes."""
        return bool(self._java.waitingForRoom())

    def received_offset(self) -> dict[str, Any] | None:
        """The source offset of the last record the engine handed over, heartbeats included (None before any): every
        record before it is queued, fetched or applied."""
        return json.loads(self._java.receivedOffset())

    def queued_batches(self) -> int:
        """Batches handed over by the engine and not yet fetched."""
        return int(self._java.queuedBatches())

    def in_flight_batches(self) -> int:
        """Batches fetched and not yet marked complete."""
        return int(self._java.inFlightBatches())

    def raise_if_failed(self) -> None:
        if self.state == "FAILED":
            raise self.failure_error(self.last_error)

    def fetch(self, timeout_seconds: float) -> FetchedBatch | None:
        """Pops the next batch, waiting at most timeout_seconds; None when nothing arrived."""
        batch = self._java.getChangeEvents(int(timeout_seconds * 1000))
        if batch is None:
            self.raise_if_failed()
            return None
        # The index and schemas (hundreds of bytes an event) come through a file, not as py4j strings.
        path = os.path.join(self._spool(), "batch.json")
        batch.writeHeader(path)
        with open(path, "rb") as header_file:
            header = json.loads(header_file.read())
        os.unlink(path)
        return FetchedBatch(
            batch_id=int(header["id"]),
            size=int(header["size"]),
            bytes=int(header.get("bytes", 0)),
            java_batch=batch,
            schemas=header["schemas"],
            last_offset=header["last_offset"],
            last_partition=header["last_partition"],
            index=header["index"],
        )

    def _spool(self) -> str:
        """A private directory of this runner for the batches' headers (removed when the runner stops)."""
        if self._spool_dir is None:
            self._spool_dir = tempfile.mkdtemp(prefix="cdc-runner-")
        return self._spool_dir

    def mark_complete(self, batch_id: int) -> int:
        """Marks the batch processed so the engine's offset moves past it; returns its event count."""
        return int(self._java.markBatchComplete(batch_id))

    def release(self, batch_id: int) -> None:
        """Lets go of an applied batch's rows and of its hold on the runner's bytes, the batch staying in flight
        (marked complete later): a part of a source transaction whose destination transaction spans groups."""
        self._java.releaseBatch(batch_id)

    def memory_report(self) -> dict[str, int]:
        return json.loads(self._java.memoryReport())

    def events_received(self) -> int:
        return int(self._java.eventsReceived())

    def progress(self) -> dict[str, Any] | None:
        """What waits where in the JVM now (`DebeziumRunner.progress`): Debezium's queue (`engine_queue`: events,
        capacity, bytes, max_bytes, the MBean read; None before its metrics exist), the runner's queued and in-flight
        batches and events, and the events handed over so far (`captured_events`). None when the JVM cannot be
        read (gone, or stopping)."""
        try:
            return json.loads(self._java.progress())
        except Py4JError as exc:
            log.debug("%s: cannot read the runner's progress: %s", self.connector, exc)
            return None

    def held_bytes(self) -> int:
        """About what the batches queued and in flight hold (bounded by `held_bytes`)."""
        return int(self._java.heldBytes())
