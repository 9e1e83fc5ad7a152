"""The slices of chunks a load copies in parallel: each slice one Spark job, run from a thread of its own
(`_SliceCopy`) so that the driver plans the next slice meanwhile; `Slices` keeps those being copied, oldest first,
reports each one's rows once it ends, and finishes the tables whose last chunks it held (their withheld primary keys
made beside the next slices). A failed copy is told by the chunk the runner's writer names (`root_message`)."""

from __future__ import annotations

import threading
from collections import deque
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable, Sequence

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame

from cdc_pipeline import faults
from cdc_pipeline.sink import deferred_keys, key_builds
from cdc_pipeline.errors import CdcError
from cdc_pipeline.capture.spark import working_on
from cdc_pipeline.bulk_load.chunk_plan import TableLoad, whole_table
from cdc_pipeline.bulk_load.copy_plan import SlicePart

if TYPE_CHECKING:
    from cdc_pipeline.bulk_load.engine import BulkLoader


def _id_ranges(ids: Sequence[int]) -> str:
    """Ids as ranges: `3-7, 9`."""
    ranges: list[list[int]] = []
    for number in sorted(ids):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


class _SliceCopy:
    """One Spark job copying a slice of chunks (read in parallel, each COPYed in its own transaction), run from a
    thread of its own so that the driver plans the next slice meanwhile; the driver's connection is used by the
    calling thread only."""

    def __init__(self, loader: BulkLoader, parts: list[SlicePart]) -> None:
        self.loader, self.parts = loader, parts
        self.ids = [chunk.id for part in parts for chunk in part.chunks]
        # The parts of a table without a key are read under one snapshot, exported by a session held until they
        # are copied.
        split = any(not part.table.key_columns and not whole_table(chunk) for part in parts for chunk in part.chunks)
        self._exporter, snapshot = loader.source.export_snapshot(loader.connector) if split else (None, None)
        try:
            direct = loader.copy_plan.source_copier(parts, snapshot)
            if direct is None and split:
                raise CdcError(f"the bulk snapshot cannot read {parts[0].table.source_table} in parts: it has no "
                               "column the destination table has", connector=loader.connector.name,
                               table=parts[0].table.source_table)
            if direct is not None:
                self._rdd, writer = direct
            else:
                lines = reduce(DataFrame.union, [loader.copy_plan.lines(part.table, part.columns, part.chunks)
                                                 for part in parts])
                writer = loader.copy_plan.writer(parts)
                # Spark's internal rows, not Row objects: the writer copies each line's UTF-8 bytes as they are. A
                # union keeps its inputs' partitions in order: one a chunk, as the writer numbers them.
                self._rdd = lines._jdf.queryExecution().toRdd().toJavaRDD()
            self._error: BaseException | None = None
            self._thread = threading.Thread(target=self._copy, args=(writer,), name="bulk-slice", daemon=True)
            self._thread.start()
        except BaseException:
            # The copy never started: the session holding its snapshot ends here (else `_copy` ends it).
            self._end_snapshot()
            raise

    def _copy(self, writer: Any) -> None:
        try:
            # Named in Spark (its UI, its status tracker) by connector, in this thread's jobs only.
            tables = len(self.parts)
            self.loader.spark.sparkContext.setJobGroup(
                slice_job_group(self.loader.connector.name),
                f"bulk snapshot: {len(self.ids)} chunks of {tables} table{'s' if tables > 1 else ''}")
            names = ", ".join(part.table.source_table for part in self.parts[:5]) + (", ..." if tables > 5 else "")
            with working_on(f"the bulk load copied chunks {_id_ranges(self.ids)} (control table bulk_load_chunks) "
                            f"of {names}"):
                self._rdd.foreachPartition(writer)
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the driver's thread
            self._error = exc
        finally:
            self._end_snapshot()

    def _end_snapshot(self) -> None:
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> tuple[int, int, float | None]:
        """Waits for the copy; returns what `BulkLoader.copied` says of its chunks, or raises its failure."""
        self._thread.join()
        if isinstance(self._error, Py4JJavaError):
            raise self.loader.copy_error(self._failed_table(self._error), self._error) from None
        if self._error is not None:
            raise self._error
        return self.loader.copied(self.ids)

    def _failed_table(self, error: Py4JJavaError) -> TableLoad:
        """The table of the chunk the writer's error names (the slice's first when it names none)."""
        chunk = root_message(error.java_exception).partition(":")[0]
        for part in self.parts:
            if any(chunk == f"chunk {c.id}" for c in part.chunks):
                return part.table
        return self.parts[0].table


class Slices:
    """The slices being copied, oldest first: each one's rows reported (`on_rows`) once it ends, and the tables
    whose last chunks it held finished then, their withheld primary keys made (`builds`) beside the next slices."""

    def __init__(self, loader: BulkLoader, on_rows: Callable[[int, int, float | None], None],
                 builds: key_builds.Builds) -> None:
        self.loader, self.on_rows, self.builds = loader, on_rows, builds
        self.running: deque[_SliceCopy] = deque()
        self.started = False
        self._copied_last: dict[str, TableLoad] = {}  # tables with every chunk dispatched, by name

    @property
    def awaiting_finish(self) -> list[TableLoad]:
        """The tables whose last chunks are being copied."""
        return list(self._copied_last.values())

    @property
    def copying(self) -> list[int]:
        return [chunk_id for copy in self.running for chunk_id in copy.ids]

    def start(self, parts: list[SlicePart]) -> None:
        self.running.append(_SliceCopy(self.loader, parts))
        self.started = True
        for part in parts:
            if part.last:
                self.finish_when_copied(part.table)

    def finish_when_copied(self, table: TableLoad) -> None:
        """The table has no chunk left to copy: it is finished once no slice being copied holds its chunks."""
        if self._holding(table):
            self._copied_last[table.source_table] = table
        else:
            self.loader.finish_tables([table])
            self.build_after_rows([table])

    def build_after_rows(self, tables: Sequence[TableLoad]) -> None:
        """Begins making the withheld primary keys and the source's secondary indexes of these tables, whose every
        chunk is copied."""
        if tables:
            loader = self.loader
            self.builds.submit(deferred_keys.waiting(
                loader.conn, loader.schema, loader.connector.name, deferred_keys.AFTER_ROWS,
                [(table.dest_schema, table.dest_table) for table in tables]))

    def wait_until_fewer(self, count: int) -> None:
        while len(self.running) >= count:
            self._wait_oldest()

    def wait_all(self) -> None:
        self.wait_until_fewer(1)

    def abandon(self) -> None:
        """Waits for the slices still copied, reporting nothing (the run is failing)."""
        while self.running:
            self.running.popleft().wait()

    def _wait_oldest(self) -> None:
        copy = self.running[0]
        self.on_rows(*copy.result())
        self.running.popleft()
        tables = [part.table for part in copy.parts]
        done = [self._copied_last.pop(table.source_table) for table in tables
                if table.source_table in self._copied_last and not self._holding(table)]
        self.loader.finish_tables(done, logged=tables)
        faults.pause_point(faults.BULK_SLICE)
        self.build_after_rows(done)

    def _holding(self, table: TableLoad) -> bool:
        return any(part.table.source_table == table.source_table for copy in self.running for part in copy.parts)


def slice_job_group(connector: str) -> str:
    """The Spark job group of the connector's bulk snapshot jobs (one a slice)."""
    return f"cdc-bulk-snapshot:{connector}"


def root_message(error: Any) -> str:
    """The innermost message of a Java exception chain (the source's or the destination's own words), with the
    chunk the writer names when it names one."""
    chunk = ""
    messages = []
    while error is not None:
        message = str(error.getMessage() or error.toString())
        if message.startswith("chunk ") and not chunk:
            chunk = message.split(":", 1)[0] + ": "
        messages.append(message)
        error = error.getCause()
    return chunk + messages[-1].strip().splitlines()[0]
