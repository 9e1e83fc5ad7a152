"""`cdc-pipeline bench --warm-driver-runs N`: what a warm driver would give a run, measured with Spark's own
mechanism, a Spark Connect server (see "A warm driver" in docs/decisions.md).

A run today starts its own driver JVM and Spark session, and its first group pays for both: the first row of a
catch-up moves 5.5-7.5 s after the process starts. This probe measures the other design, before the pipeline is
ported to it: a Spark Connect server, started once with the pipeline's own driver settings (`spark_settings`: the
runner's classpath, the compiler and collector options, the class archive), and fresh client processes that each
apply one group of changes through it, as a run would.

What stands in for the parts the port would build (so the figures are of the driver, not of a finished design):
- the group's change lines are already in the server, as the runner would hold them there (a global temporary view
  made once by a set-up client, since a runner in the server is not built);
- the net changes are staged by Spark's JDBC writer into a table the client then merges from (the pipeline's tasks
  COPY with `StageCopyWriter`, which a Connect client cannot call).
Each client parses the lines with the pipeline's row-image schema, keeps each key's last change (a window over
the key, as `compact_by_key`), stages, merges (DELETE, then INSERT ... ON CONFLICT) and commits; the time from its
process's start to that commit is its first row moved. The first client's run is reported apart: it is the
server's first query of that shape (compiling it), which a long-lived server pays once.

The Connect client needs libraries the pipeline does not (pyarrow, grpcio-status, googleapis-common-protos,
zstandard): they go into a virtualenv of their own under the cache directory, which sees the pipeline's own
packages (PySpark, psycopg) through a path file. It is a command, not a test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SERVER_START_TIMEOUT_SECONDS = 180.0
CLIENT_TIMEOUT_SECONDS = 300.0
GROUP_CHANGES = 2048  # one runner batch: the size of a catch-up's first group
VENV_ENV = "CDC_CONNECT_CLIENT_VENV"
TABLE = "items"
STAGE_TABLE = "stage_items"
LINES_VIEW = "cdc_probe_lines"


def client_requirements() -> list[str]:
    """What the Connect client imports beyond the pipeline's packages; grpcio-status matches the grpcio installed."""
    from importlib.metadata import version

    return ["pyarrow", f"grpcio-status=={version('grpcio')}", "googleapis-common-protos", "zstandard", "pandas<3"]


def ensure_client_venv() -> Path:
    """The Connect client's interpreter: a virtualenv (made on first use) that also sees the pipeline's packages."""
    venv = Path(os.environ.get(VENV_ENV) or Path.home() / ".cache" / "cdc-pipeline" / "connect-client")
    python = venv / "bin" / "python"
    marker = venv / ".cdc-ready"
    if not marker.is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *client_requirements()], check=True)
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        project_root = Path(__file__).resolve().parents[2]
        # After the venv's own packages: PySpark, psycopg and this package come from the pipeline's environment.
        (Path(purelib) / "zz_cdc_pipeline.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{project_root}\n")
        marker.write_text("ok\n")
    return python


def _rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


@contextmanager
def connect_server(work: Path) -> Iterator[dict[str, Any]]:
    """A Spark Connect server with the pipeline's driver settings on a free port; yields its port, pid and start
    seconds, and stops it at the end."""
    from cdc_pipeline.capture.spark import spark_settings
    from cdc_pipeline.capture.spark_home import driver_home
    from cdc_pipeline.testing.servers import free_port

    port = free_port()
    settings = {**spark_settings(), "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port)}
    memory = settings.pop("spark.driver.memory", "2g")
    home = driver_home()
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
               "--driver-memory", memory]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    log = (work / "connect-server.log").open("w")
    started = time.monotonic()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"})
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited ({server.returncode}): "
                                   f"{(work / 'connect-server.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() - started > SERVER_START_TIMEOUT_SECONDS:
                    raise RuntimeError("the Spark Connect server did not listen within "
                                       f"{SERVER_START_TIMEOUT_SECONDS:.0f} s") from None
                time.sleep(0.1)
        # spark-submit execs the JVM: the process is the server.
        yield {"port": port, "pid": server.pid, "start_seconds": round(time.monotonic() - started, 2)}
    finally:
        _stop(server)
        log.close()


def _stop(server: subprocess.Popen) -> None:
    """Stops the server's process group (spark-submit and the JVM it became); one already gone is left be."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def group_lines(changes: int) -> list[str]:
    """A group of runner data lines (`EventSerializer.dataLine`) of the bench's table: three updates in four, one
    delete in four."""
    lines = []
    for key in range(1, changes + 1):
        before = {"id": key, "name": f"item-{key}", "amount": f"{key / 100:.2f}", "qty": key % 1000,
                  "created": 1704067200000 + key * 1000, "note": "x" * (key % 50)}
        op = "d" if key % 4 == 0 else "u"
        after = None if op == "d" else {**before, "qty": before["qty"] + 1, "note": "updated"}
        lines.append(json.dumps({"seq": key, "schema": "1", "value": {"op": op, "before": before, "after": after}},
                                separators=(",", ":")))
    return lines


def _run_client(python: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([str(python), "-m", "cdc_pipeline.testing.warm_driver", *args], capture_output=True,
                          text=True, timeout=CLIENT_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise RuntimeError(f"the Connect client failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_warm_driver(runs: int, changes: int = GROUP_CHANGES) -> dict[str, Any]:
    """Starts the server and a throwaway PostgreSQL, makes the group, and measures `runs` fresh clients after the
    server's first query of the shape (reported apart)."""
    from cdc_pipeline.capture.runner import build_runner
    from cdc_pipeline.testing.servers import start_postgres

    build_runner()
    python = ensure_client_venv()
    with tempfile.TemporaryDirectory(prefix="cdc-warm-") as work_dir:
        work = Path(work_dir)
        with start_postgres(work) as destination, connect_server(work) as server:
            destination.create_database("warm")
            dsn = destination.dsn("warm")
            _make_table(dsn, changes)
            lines_file = work / "lines.json"
            lines_file.write_text(json.dumps(group_lines(changes)))
            url = f"sc://127.0.0.1:{server['port']}"
            _run_client(python, "setup", url, str(lines_file))
            first = _run_client(python, "apply", url, dsn)
            measured = [_run_client(python, "apply", url, dsn) for _ in range(runs)]
            median_run = sorted(measured, key=lambda run: run["committed"])[len(measured) // 2]
            return {"changes": changes, "runs": runs, "server_start_seconds": server["start_seconds"],
                    "server_rss_mb": _rss_mb(server["pid"]),
                    "server_first_query_run": first,
                    "first_row_seconds": [run["committed"] for run in measured],
                    "first_row_seconds_median": median_run["committed"], "median_run": median_run,
                    "exact": _applied_exactly(dsn, changes)}


def _make_table(dsn: str, rows: int) -> None:
    """The bench's table of `rows` rows (keys 1..rows), as the group's before images have them."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as connection:
        connection.execute(sql.SQL("""CREATE TABLE {} (id int PRIMARY KEY, name varchar(64), amount numeric(12,2),
            qty int, created timestamp(3), note text)""").format(sql.Identifier(TABLE)))
        connection.execute(sql.SQL("""INSERT INTO {} SELECT g, 'item-' || g, g / 100.0, g %% 1000,
            timestamp '2024-01-01' + g * interval '1 second', repeat('x', g %% 50)
            FROM generate_series(1, %s) g""").format(sql.Identifier(TABLE)), (rows,))


def _applied_exactly(dsn: str, changes: int) -> bool:
    """Whether the table holds what the group leaves: every fourth key deleted, the others updated."""
    import psycopg
    from psycopg import sql

    kept = [key for key in range(1, changes + 1) if key % 4]
    with psycopg.connect(dsn) as connection:
        rows, qty, updated = connection.execute(sql.SQL(
            "SELECT count(*), sum(qty), count(*) FILTER (WHERE note = 'updated') FROM {}").format(
            sql.Identifier(TABLE))).fetchone()
    return (rows, qty, updated) == (len(kept), sum(key % 1000 + 1 for key in kept), len(kept))


def _client(argv: list[str]) -> dict[str, Any]:
    """The client's work (in the Connect client's virtualenv): `setup URL LINES_FILE` puts the group in the server;
    `apply URL DSN` applies it, marking each step's time since the process started."""
    marks: dict[str, float] = {"imports_begin": time.time()}
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    import psycopg
    from psycopg import sql

    from cdc_pipeline.decode.events import ROW_IMAGES

    marks["imported"] = time.time()
    command, url = argv[0], argv[1]
    spark = SparkSession.builder.remote(url).getOrCreate()
    marks["connected"] = time.time()
    if command == "setup":
        lines = json.loads(Path(argv[2]).read_text())
        frame = spark.createDataFrame([(line,) for line in lines], "line string")
        frame.createOrReplaceGlobalTempView(LINES_VIEW)
        return {"lines": spark.table(f"global_temp.{LINES_VIEW}").count()}
    dsn = argv[2]
    value = F.col("e.value")
    events = spark.table(f"global_temp.{LINES_VIEW}").select(F.from_json("line", ROW_IMAGES).alias("e")).select(
        F.col("e.seq").alias("seq"), value["op"].alias("op"), value["before"].alias("before"),
        value["after"].alias("after"))
    key = F.when(F.col("op") == "d", F.col("before")["id"]).otherwise(F.col("after")["id"])
    last = Window.partitionBy("_key").orderBy(F.col("seq").desc())
    net = events.withColumn("_key", key).withColumn("_rank", F.row_number().over(last)).where(F.col("_rank") == 1)

    def after(name: str) -> Any:
        return F.col("after")[name]

    staged = net.select(
        "op", F.col("_key").cast("int").alias("id"), after("name").alias("name"),
        after("amount").cast("decimal(12,2)").alias("amount"), after("qty").cast("int").alias("qty"),
        F.timestamp_millis(after("created").cast("long")).alias("created"), after("note").alias("note"))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    jdbc_url = f"jdbc:postgresql://{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info['dbname']}"
    staged.write.format("jdbc").option("url", jdbc_url).option("user", info.get("user", "postgres")) \
        .option("dbtable", STAGE_TABLE).option("driver", "org.postgresql.Driver").mode("overwrite").save()
    marks["staged"] = time.time()
    names = {"t": sql.Identifier(TABLE), "s": sql.Identifier(STAGE_TABLE)}
    with psycopg.connect(dsn) as connection:
        connection.execute(sql.SQL("DELETE FROM {t} t USING {s} s WHERE s.op = 'd' AND t.id = s.id").format(**names))
        connection.execute(sql.SQL(
            """INSERT INTO {t} SELECT id, name, amount, qty, created, note FROM {s} WHERE op <> 'd'
               ON CONFLICT (id) DO UPDATE SET name = excluded.name, amount = excluded.amount, qty = excluded.qty,
               created = excluded.created, note = excluded.note""").format(**names))
    marks["committed"] = time.time()
    # Imported last: the pipeline's cycle module is not what a client needs before its first row.
    from cdc_pipeline.cycle import process_started_epoch

    started = process_started_epoch() or float("nan")
    return {name: round(at - started, 2) for name, at in marks.items()}


if __name__ == "__main__":
    print(json.dumps(_client(sys.argv[1:])))
