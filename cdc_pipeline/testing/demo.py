"""The demo behind `make demo`: replicate a sample MariaDB database into PostgreSQL and compare both sides.

``python -m cdc_pipeline.testing.demo`` starts a MariaDB (row binlog) and a destination PostgreSQL whose files
live in ``.demo/mariadb`` and ``.demo/postgres`` under the current directory, or reuses them when
``.demo/state.json`` names servers that are still running. The servers outlive the command, so
``dagster dev`` can keep replicating from them; ``python -m cdc_pipeline.testing.demo stop`` (``make demo-stop``)
shuts them down and leaves the files. Servers recorded but no longer running are not revived: their
directories are wiped and fresh servers start on new ports.

Every run starts from a clean slate: it drops and recreates the source database ``inventory`` and the
destination database ``cdc_demo`` (which also holds the connector's offsets and schema history), so the
first sync is always a full snapshot. It then writes ``.demo/connectors.yaml`` and ``.demo/env`` (mode
0600, the only place the random passwords are kept), syncs, changes the source (inserts, updates,
deletes, a new column and a new table), syncs again and compares row counts and content checksums of
every table; the exit code is 1 when any table differs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from cdc_pipeline.ops.cli import format_summary, run_sync
from cdc_pipeline.config import CONFIG_PATH_ENV, redact_dsn
from cdc_pipeline.testing.servers import LOOPBACK_HOST, MariaDbServer, PostgresServer, free_port
from cdc_pipeline.sources.quoting import quote_mysql

logger = logging.getLogger(__name__)

DEMO_DIR = Path(".demo")
DAGSTER_HOME_DIR = Path("dagster_home")
WORKSPACE_FILE = Path("workspace.yaml")
CONNECTOR_NAME = "inventory"
SOURCE_DATABASE = "inventory"
CAPTURE_USER = "dbz"
DESTINATION_DATABASE = "cdc_demo"
DESTINATION_USER = "cdc_demo"
SOURCE_PASSWORD_ENV = "CDC_DEMO_SOURCE_PASSWORD"
DESTINATION_DSN_ENV = "CDC_DEMO_DEST_DSN"
SAMPLE_SEED = 20240501
GROUP_CONCAT_MAX_LENGTH = 64 * 1024 * 1024
NULL_MARKER = "\\N"

SOURCE_TABLES = (
    """CREATE TABLE customers (
        id INT AUTO_INCREMENT PRIMARY KEY,
        first_name VARCHAR(50) NOT NULL,
        last_name VARCHAR(50) NOT NULL,
        email VARCHAR(120) NOT NULL UNIQUE,
        city VARCHAR(60),
        notes TEXT,
        created_at DATETIME NOT NULL)""",
    """CREATE TABLE products (
        id INT AUTO_INCREMENT PRIMARY KEY,
        sku VARCHAR(20) NOT NULL UNIQUE,
        name VARCHAR(100) NOT NULL,
        description TEXT,
        price DECIMAL(10,2) NOT NULL,
        weight_kg DECIMAL(8,3),
        in_stock INT NOT NULL DEFAULT 0,
        added_on DATE NOT NULL)""",
    """CREATE TABLE orders (
        id INT AUTO_INCREMENT PRIMARY KEY,
        customer_id INT NOT NULL,
        order_date DATE NOT NULL,
        status VARCHAR(20) NOT NULL,
        shipped_at DATETIME NULL,
        total DECIMAL(12,2) NOT NULL)""",
    """CREATE TABLE order_lines (
        order_id INT NOT NULL,
        line_no INT NOT NULL,
        product_id INT NOT NULL,
        quantity INT NOT NULL,
        unit_price DECIMAL(10,2) NOT NULL,
        PRIMARY KEY (order_id, line_no))""",
)
REVIEWS_TABLE = """CREATE TABLE reviews (
    id INT AUTO_INCREMENT PRIMARY KEY,
    product_id INT NOT NULL,
    customer_id INT NOT NULL,
    rating TINYINT NOT NULL,
    title VARCHAR(80),
    body TEXT,
    reviewed_at DATETIME NOT NULL)"""

FIRST_NAMES = ("Anne", "Bruno", "Chloé", "Dmitri", "Elif", "Farid", "Grace", "Hiro", "Inès", "Jonas",
               "Kofi", "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Zoë")
LAST_NAMES = ("Kretchmar", "Walker", "Müller", "Okafor", "Santos", "Nakamura", "Dubois", "Ivanova",
              "O'Brien", "Larsen", "García", "Kowalski")
CITIES = ("Lisbon", "Berlin", "Nairobi", "Osaka", "Montréal", "Austin", "Porto", "Kraków", None)
PRODUCT_WORDS = ("scooter", "drill", "hammer", "rope", "jacket", "lamp", "kettle", "tent", "helmet", "battery")
PRODUCT_ADJECTIVES = ("small", "heavy-duty", "folding", "cordless", "waterproof", "compact", "classic", "12V")
ORDER_STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")
BASE_DAY = date(2024, 1, 1)


@dataclass(frozen=True)
class DemoServers:
    """The demo's two servers and whether they were already running before this command."""

    mariadb: MariaDbServer
    postgres: PostgresServer
    reused: bool


@dataclass(frozen=True)
class TableComparison:
    """One table's row count and content checksum on the source and on the destination (None: no table)."""

    table: str
    source_rows: int
    destination_rows: int | None
    source_checksum: str
    destination_checksum: str | None

    @property
    def rows_equal(self) -> bool:
        return self.source_rows == self.destination_rows

    @property
    def checksums_equal(self) -> bool:
        return self.source_checksum == self.destination_checksum


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo (default) or stop its servers (`stop`); returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m cdc_pipeline.testing.demo", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "stop"), default="run")
    parser.add_argument("-v", "--verbose", action="store_true", help="log diagnostics at INFO level")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("CDC_RUNNER_LOG_LEVEL", "INFO" if args.verbose else "WARN")
    demo_dir = DEMO_DIR.absolute()
    if args.command == "stop":
        return stop_demo(demo_dir)
    return run_demo(demo_dir)


def run_demo(demo_dir: Path) -> int:
    """Set up servers, data and configuration, sync, change the source, sync again and compare both sides."""
    started = time.monotonic()
    servers = open_servers(demo_dir)
    verb = "Reusing" if servers.reused else "Started"
    print(f"{verb} MariaDB on {LOOPBACK_HOST}:{servers.mariadb.port} and PostgreSQL on "
          f"{LOOPBACK_HOST}:{servers.postgres.port} (files in {demo_dir})")

    source_password = secrets.token_urlsafe(18)
    destination_password = secrets.token_urlsafe(18)
    create_source_database(servers.mariadb, source_password)
    destination_dsn = create_destination_database(servers.postgres, destination_password)
    write_demo_config(demo_dir, servers.mariadb, source_password, destination_dsn)
    print(f"Source database {SOURCE_DATABASE}: {describe_source(servers.mariadb)}")
    print(f"Destination: {redact_dsn(destination_dsn)}")

    try:
        sync("Initial sync (snapshot)")
        print("Changing the source: inserts, updates and deletes in four tables, a new column, a new table")
        change_source(servers.mariadb)
        sync("Second sync (changes)")
    except Exception as error:  # the demo's contract: a failed sync is one message and exit code 1
        logger.info("sync failed", exc_info=True)
        print(f"\nSync failed: {error}", file=sys.stderr)
        print("Details with -v. The servers are still running; stop them with: make demo-stop", file=sys.stderr)
        return 1

    comparisons = compare_tables(servers.mariadb, destination_dsn)
    print()
    print(format_comparison(comparisons))
    all_equal = all(row.rows_equal and row.checksums_equal for row in comparisons)
    if all_equal:
        print(f"\nAll {len(comparisons)} tables have equal row counts and equal content on both sides.")
    else:
        differing = ", ".join(row.table for row in comparisons if not (row.rows_equal and row.checksums_equal))
        print(f"\nMISMATCH: {differing} differ between source and destination.")
    print(f"Demo finished in {time.monotonic() - started:.0f} s.")
    print_next_steps(demo_dir)
    return 0 if all_equal else 1


def stop_demo(demo_dir: Path) -> int:
    """Shut down the servers recorded in .demo/state.json; the files stay. Does nothing if none is running."""
    state = read_state(demo_dir)
    if state is None:
        print(f"No demo servers recorded in {demo_dir / 'state.json'}; nothing to stop.")
        return 0
    mariadb, postgres = demo_server_objects(demo_dir, state)
    for name, server in (("MariaDB", mariadb), ("PostgreSQL", postgres)):
        try:
            server.attach()
        except RuntimeError as error:
            logger.info("%s not running: %s", name, error)
            print(f"{name} on port {server.port} is not running.")
            continue
        server.stop()
        print(f"{name} on port {server.port} stopped.")
    return 0


def open_servers(demo_dir: Path) -> DemoServers:
    """Attach to the servers recorded in state.json if both still run; else wipe their files and start new ones."""
    state = read_state(demo_dir)
    if state is not None:
        mariadb, postgres = demo_server_objects(demo_dir, state)
        try:
            mariadb.attach()
            postgres.attach()
            return DemoServers(mariadb, postgres, reused=True)
        except RuntimeError as error:
            logger.info("recorded demo servers are not reusable (%s); starting new ones", error)
            mariadb.stop()
            postgres.stop()
    for work_dir in (demo_dir / "mariadb", demo_dir / "postgres"):
        shutil.rmtree(work_dir, ignore_errors=True)
    mariadb, postgres = demo_server_objects(demo_dir, {"mariadb": {"port": free_port()},
                                                       "postgres": {"port": free_port()}})
    # Recorded before starting, so a server left behind by a failed start is found and stopped next time.
    write_state(demo_dir, mariadb, postgres)
    mariadb.start()
    postgres.start()
    write_state(demo_dir, mariadb, postgres)
    return DemoServers(mariadb, postgres, reused=False)


def demo_server_objects(demo_dir: Path, state: dict[str, Any]) -> tuple[MariaDbServer, PostgresServer]:
    """The server objects for the demo's directories and the ports in state; they outlive this process."""
    mariadb_dir = demo_dir / "mariadb"
    mariadb = MariaDbServer(
        port=int(state["mariadb"]["port"]),
        datadir=mariadb_dir / "data",
        socket=mariadb_dir / "mariadb.sock",
        remove_on_stop=False,
        stop_at_exit=False,
    )
    postgres = PostgresServer(
        port=int(state["postgres"]["port"]),
        datadir=demo_dir / "postgres" / "data",
        remove_on_stop=False,
        stop_at_exit=False,
    )
    return mariadb, postgres


def read_state(demo_dir: Path) -> dict[str, Any] | None:
    """The ports and pids recorded by the last start, or None when there is no readable state file."""
    try:
        state = json.loads((demo_dir / "state.json").read_text())
        int(state["mariadb"]["port"]), int(state["postgres"]["port"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.info("no usable demo state in %s: %s", demo_dir, error)
        return None
    return state


def write_state(demo_dir: Path, mariadb: MariaDbServer, postgres: PostgresServer) -> None:
    demo_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "mariadb": {"port": mariadb.port, "pid": mariadb.pid, "work_dir": str(mariadb.work_dir)},
        "postgres": {"port": postgres.port, "pid": postgres.pid, "work_dir": str(postgres.work_dir)},
    }
    (demo_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def create_source_database(mariadb: MariaDbServer, capture_password: str) -> None:
    """Drop and recreate the inventory database with deterministic sample rows, and (re)create the capture user."""
    rows = sample_rows(random.Random(SAMPLE_SEED))
    mariadb.execute([f"DROP DATABASE IF EXISTS {quote_mysql(SOURCE_DATABASE)}",
                     f"CREATE DATABASE {quote_mysql(SOURCE_DATABASE)}"])
    mariadb.execute(list(SOURCE_TABLES), database=SOURCE_DATABASE)
    with mariadb.connect(SOURCE_DATABASE) as connection, connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO customers (first_name, last_name, email, city, notes, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)", rows["customers"])
        cursor.executemany(
            "INSERT INTO products (sku, name, description, price, weight_kg, in_stock, added_on)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)", rows["products"])
        cursor.executemany(
            "INSERT INTO orders (customer_id, order_date, status, shipped_at, total)"
            " VALUES (%s, %s, %s, %s, %s)", rows["orders"])
        cursor.executemany(
            "INSERT INTO order_lines (order_id, line_no, product_id, quantity, unit_price)"
            " VALUES (%s, %s, %s, %s, %s)", rows["order_lines"])
    mariadb.create_capture_user(CAPTURE_USER, capture_password)


def sample_rows(rng: random.Random) -> dict[str, list[tuple]]:
    """About 400 rows for the four tables; the same rows for the same generator state."""
    customers = []
    for number in range(1, 61):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        email = f"{first}.{last}.{number}@example.com".lower().replace("'", "")
        notes = rng.choice((None, "prefers e-mail", "VIP since 2019", "call before delivery\nback door"))
        created_at = datetime(2023, 1, 1, 8) + timedelta(minutes=rng.randrange(500_000))
        customers.append((first, last, email, rng.choice(CITIES), notes, created_at))
    products = []
    for number in range(1, 41):
        name = f"{rng.choice(PRODUCT_ADJECTIVES)} {rng.choice(PRODUCT_WORDS)}"
        description = None if number % 7 == 0 else f"A {name} ({number}), tested and boxed."
        price = Decimal(rng.randrange(199, 49_999)) / 100
        weight = Decimal(rng.randrange(50, 25_000)) / 1000
        products.append((f"SKU-{number:05d}", name, description, price, weight, rng.randrange(0, 500),
                         BASE_DAY - timedelta(days=rng.randrange(700))))
    orders, order_lines = [], []
    for order_id in range(1, 101):
        order_date = BASE_DAY + timedelta(days=rng.randrange(120))
        status = rng.choice(ORDER_STATUSES)
        shipped_at = (datetime.combine(order_date, datetime.min.time()) + timedelta(hours=rng.randrange(24, 96))
                      if status in ("shipped", "delivered") else None)
        total = Decimal(0)
        for line_no in range(1, rng.randrange(2, 5)):
            product = rng.randrange(1, 41)
            quantity = rng.randrange(1, 6)
            unit_price = products[product - 1][3]
            total += quantity * unit_price
            order_lines.append((order_id, line_no, product, quantity, unit_price))
        orders.append((rng.randrange(1, 61), order_date, status, shipped_at, total))
    return {"customers": customers, "products": products, "orders": orders, "order_lines": order_lines}


def change_source(mariadb: MariaDbServer) -> None:
    """Insert, update and delete rows in every table, add a column and create and fill a new table."""
    with mariadb.connect(SOURCE_DATABASE) as connection, connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO customers (first_name, last_name, email, city, notes, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [(f"New{number}", "Customer", f"new.customer.{number}@example.com", "Tallinn", None,
              datetime(2024, 6, 1, 9, number)) for number in range(1, 6)])
        cursor.execute("UPDATE customers SET city = 'Reykjavík', notes = CONCAT(COALESCE(notes, ''), ' (moved)')"
                       " WHERE id % 10 = 3")
        cursor.execute("DELETE FROM customers WHERE id NOT IN (SELECT customer_id FROM orders) ORDER BY id LIMIT 3")
        cursor.execute("UPDATE products SET price = ROUND(price * 1.10, 2), in_stock = in_stock + 5"
                       " WHERE id % 4 = 0")
        cursor.execute("ALTER TABLE products ADD COLUMN discontinued_on DATE NULL")
        cursor.execute("UPDATE products SET discontinued_on = '2024-05-31' WHERE id IN (5, 6)")
        cursor.execute("UPDATE orders SET status = 'shipped', shipped_at = '2024-06-02 14:30:00'"
                       " WHERE status = 'paid'")
        cursor.execute("DELETE FROM order_lines WHERE order_id IN (SELECT id FROM orders WHERE status = 'cancelled')")
        cursor.execute("DELETE FROM orders WHERE status = 'cancelled'")
        cursor.execute("DELETE FROM order_lines WHERE line_no = 3 AND order_id % 3 = 0")
        cursor.execute("UPDATE order_lines SET quantity = quantity + 1 WHERE order_id % 5 = 1 AND line_no = 1")
        for number in range(1, 11):
            cursor.execute("INSERT INTO orders (customer_id, order_date, status, shipped_at, total)"
                           " VALUES (%s, %s, 'new', NULL, 0)", (number * 5, date(2024, 6, 3)))
            order_id = cursor.lastrowid
            cursor.executemany(
                "INSERT INTO order_lines (order_id, line_no, product_id, quantity, unit_price)"
                " SELECT %s, %s, id, %s, price FROM products WHERE id = %s",
                [(order_id, line_no, line_no, number + line_no) for line_no in (1, 2)])
            cursor.execute("UPDATE orders SET total = (SELECT SUM(quantity * unit_price) FROM order_lines"
                           " WHERE order_id = %s) WHERE id = %s", (order_id, order_id))
        cursor.execute(REVIEWS_TABLE)
        cursor.executemany(
            "INSERT INTO reviews (product_id, customer_id, rating, title, body, reviewed_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [(number % 40 + 1, number % 60 + 1, number % 5 + 1, f"Review {number}",
              None if number % 6 == 0 else f"Rated {number % 5 + 1} of 5: works as described.",
              datetime(2024, 6, 4, 10) + timedelta(minutes=17 * number)) for number in range(1, 31)])


def create_destination_database(postgres: PostgresServer, password: str) -> str:
    """Drop and recreate the destination database, owned by a login role with password; returns its DSN."""
    role = sql.Identifier(DESTINATION_USER)
    database = sql.Identifier(DESTINATION_DATABASE)
    with psycopg.connect(postgres.dsn(), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        exists = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DESTINATION_USER,)).fetchone()
        verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
        connection.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, role, sql.Literal(password)))
        connection.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
    return postgres.dsn(DESTINATION_DATABASE, user=DESTINATION_USER, password=password)


def write_demo_config(demo_dir: Path, mariadb: MariaDbServer, source_password: str, destination_dsn: str) -> None:
    """Write .demo/connectors.yaml and .demo/env and set the same variables in this process's environment."""
    config_file = demo_dir / "connectors.yaml"
    config = {
        "destination": {"dsn": f"${{{DESTINATION_DSN_ENV}}}"},
        "connectors": {
            CONNECTOR_NAME: {
                "type": "mariadb",
                "hostname": mariadb.host,
                "port": mariadb.port,
                "user": CAPTURE_USER,
                "password": f"${{{SOURCE_PASSWORD_ENV}}}",
                "database": SOURCE_DATABASE,
                "schedule": "* * * * *",
                "idle_timeout_seconds": 3,
            }
        },
    }
    header = "# Written by `python -m cdc_pipeline.testing.demo`; the secrets are in .demo/env.\n"
    config_file.write_text(header + yaml.safe_dump(config, sort_keys=False))
    DAGSTER_HOME_DIR.mkdir(exist_ok=True)
    variables = {
        CONFIG_PATH_ENV: str(config_file),
        SOURCE_PASSWORD_ENV: source_password,
        DESTINATION_DSN_ENV: destination_dsn,
        "DAGSTER_HOME": str(DAGSTER_HOME_DIR.absolute()),
    }
    env_file = demo_dir / "env"
    descriptor = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        os.fchmod(stream.fileno(), 0o600)
        stream.write("# Written by `python -m cdc_pipeline.testing.demo`; load with: set -a; . .demo/env; set +a\n")
        stream.writelines(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())
    os.environ.update(variables)


def describe_source(mariadb: MariaDbServer) -> str:
    counts = {table: source_row_count(mariadb, table) for table in source_tables(mariadb)}
    tables = ", ".join(f"{table} {rows}" for table, rows in counts.items())
    return f"{sum(counts.values())} rows ({tables})"


def sync(title: str) -> None:
    """Run one fetch cycle of the demo connector (its Dagster job's steps, in this process) and print its summary."""
    print(f"\n{title}: one fetch cycle of {CONNECTOR_NAME} (starts Spark and Debezium) ...", flush=True)
    started = time.monotonic()
    summary = run_sync(CONNECTOR_NAME)
    print(f"  {format_summary(summary)}")
    print(f"  (the job took {time.monotonic() - started:.0f} s in all)")


def source_tables(mariadb: MariaDbServer) -> list[str]:
    rows = mariadb.query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()",
                         database=SOURCE_DATABASE)
    return sorted(name for (name,) in rows)


def source_row_count(mariadb: MariaDbServer, table: str) -> int:
    return int(mariadb.query(f"SELECT COUNT(*) FROM {quote_mysql(table)}", database=SOURCE_DATABASE)[0][0])


def compare_tables(mariadb: MariaDbServer, destination_dsn: str) -> list[TableComparison]:
    """Row counts and content checksums of every source table and of its copy in the destination."""
    comparisons = []
    with psycopg.connect(destination_dsn, autocommit=True) as destination:
        for table in source_tables(mariadb):
            columns, key = source_columns(mariadb, table)
            source_rows, source_checksum = count_and_checksum_source(mariadb, table, columns, key)
            destination_rows, destination_checksum = count_and_checksum_destination(
                destination, SOURCE_DATABASE.lower(), table.lower(), [column.lower() for column in columns],
                [column.lower() for column in key])
            comparisons.append(TableComparison(table, source_rows, destination_rows,
                                               source_checksum, destination_checksum))
    return comparisons


def source_columns(mariadb: MariaDbServer, table: str) -> tuple[list[str], list[str]]:
    """The table's columns in order and its primary-key columns in key order (all columns if it has no key)."""
    with mariadb.connect(SOURCE_DATABASE) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns"
                       " WHERE table_schema = DATABASE() AND table_name = %s ORDER BY ordinal_position", (table,))
        columns = [name for (name,) in cursor.fetchall()]
        cursor.execute("SELECT column_name FROM information_schema.key_column_usage"
                       " WHERE table_schema = DATABASE() AND table_name = %s AND constraint_name = 'PRIMARY'"
                       " ORDER BY ordinal_position", (table,))
        key = [name for (name,) in cursor.fetchall()]
    return columns, key or columns


def count_and_checksum_source(mariadb: MariaDbServer, table: str, columns: list[str],
                              key: list[str]) -> tuple[int, str]:
    """The row count and the MD5 of all rows as text (values joined by '|', NULL as \\N, rows in key order)."""
    values = ", ".join(f"COALESCE({quote_mysql(column)}, %s)" for column in columns)
    order = ", ".join(quote_mysql(column) for column in key)
    query = (f"SELECT COUNT(*), COALESCE(MD5(GROUP_CONCAT(CONCAT_WS('|', {values}) ORDER BY {order}"
             f" SEPARATOR %s)), '') FROM {quote_mysql(table)}")
    with mariadb.connect(SOURCE_DATABASE) as connection, connection.cursor() as cursor:
        cursor.execute("SET SESSION group_concat_max_len = %s", (GROUP_CONCAT_MAX_LENGTH,))
        cursor.execute(query, (*[NULL_MARKER] * len(columns), "\n"))
        count, checksum = cursor.fetchone()
    return int(count), checksum


def count_and_checksum_destination(connection: psycopg.Connection, schema: str, table: str, columns: list[str],
                                   key: list[str]) -> tuple[int | None, str | None]:
    """Like count_and_checksum_source, on the destination copy; (None, None) when the table does not exist."""
    exists = connection.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s"
                                " AND table_name = %s", (schema, table)).fetchone()
    if exists is None:
        return None, None
    values = sql.SQL(", ").join(
        sql.SQL("coalesce({}::text, {})").format(sql.Identifier(column), sql.Literal(NULL_MARKER))
        for column in columns)
    query = sql.SQL("SELECT count(*), coalesce(md5(string_agg(concat_ws('|', {values}), {separator}"
                    " ORDER BY {order})), '') FROM {table}").format(
        values=values,
        separator=sql.Literal("\n"),
        order=sql.SQL(", ").join(sql.Identifier(column) for column in key),
        table=sql.Identifier(schema, table),
    )
    count, checksum = connection.execute(query).fetchone()
    return count, checksum


def format_comparison(comparisons: list[TableComparison]) -> str:
    """A small text table: rows on each side and whether the contents match, per table."""
    header = ("table", f"source {SOURCE_DATABASE}.<t>", f"destination {SOURCE_DATABASE.lower()}.<t>", "rows", "content")
    lines = [header]
    for row in comparisons:
        lines.append((
            row.table,
            str(row.source_rows),
            "missing" if row.destination_rows is None else str(row.destination_rows),
            "equal" if row.rows_equal else "DIFFER",
            "equal" if row.checksums_equal else "DIFFER",
        ))
    widths = [max(len(line[index]) for line in lines) for index in range(len(header))]
    rendered = []
    for number, line in enumerate(lines):
        cells = [line[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(line[1:3], widths[1:3])),
                 *(cell.ljust(width) for cell, width in zip(line[3:], widths[3:]))]
        rendered.append("  ".join(cells).rstrip())
        if number == 0:
            rendered.append("  ".join("-" * width for width in widths))
    return "\n".join(rendered)


def print_next_steps(demo_dir: Path) -> None:
    env_file = os.path.relpath(demo_dir / "env")
    print("\nThe servers keep running. Open the Dagster UI on the same configuration and instance with:")
    print(f"  set -a; . {env_file}; set +a; .venv/bin/dagster dev -w {WORKSPACE_FILE}")
    print("Stop the demo servers with:")
    print("  make demo-stop   (runs: python -m cdc_pipeline.testing.demo stop)")


if __name__ == "__main__":
    sys.exit(main())
