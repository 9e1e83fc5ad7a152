"""Source tables the connector's stream never created: a database that came to match a connector's `databases` (a
pattern widened, a name added, a database restored without the binlog), or a table added to `tables` later. Debezium
streams their changes from then on but never their rows, nor a CREATE TABLE.

`unseen_tables` lists them (MariaDB/MySQL: the source's tables of the connector's databases that the connector writes
no destination table for); a load copies them while the others keep their rows. `create_tables` makes their
destination tables as the stream's DDL would: each table's `SHOW CREATE TABLE` read by Debezium's own DDL parser in
the driver JVM (`SourceTableChanges` of the runner), converted by the same converter and mapping rules.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import psycopg

from cdc_pipeline.capture.runner import JAVA_PACKAGE
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.ddl import changes_from_schema_event, create_table_sql
from cdc_pipeline.errors import CdcError
from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sources import captures, module_for

log = logging.getLogger(__name__)


def creates_tables(connector: ConnectorConfig) -> bool:
    """Whether the connector's source type can describe a table as its stream's DDL would (`create_statements`)."""
    return module_for(connector.type).create_statements is not None


def unseen_tables(cur: psycopg.Cursor, schema: str, connector: ConnectorConfig, object_map: objmap.ObjectMap,
                  source_cur: Any) -> list[str]:
    """The source tables of the connector (captured, on the source now) whose destination table (as the rules name
    it) the connector does not write: none of its loads copied them and its stream created none of them. A table
    that a rule merges into another's destination table is seen once that table is the connector's."""
    if not creates_tables(connector):
        return []
    owned = set(rule_store.owned_tables(cur, schema, connector.name))
    return [table.name for table in module_for(connector.type).tables_of(source_cur, connector)
            if captures(connector, table.name) and object_map.table_name(table.name) not in owned]


def create_tables(cur: psycopg.Cursor, schema: str, connector: ConnectorConfig, object_map: objmap.ObjectMap,
                  jvm: Any, source_cur: Any, source_tables: Sequence[str]) -> list[tuple[str, str]]:
    """Creates the destination tables of these source tables (`db.table`) from their source definition, in the
    caller's transaction, and records their columns and the connector as their writer; returns their destination
    names. Raises CdcError naming the table when the source or the parser cannot describe one."""
    source = module_for(connector.type)
    by_database: dict[str, list[str]] = {}
    for source_table in source_tables:
        database, table = connector.split_table(source_table)
        by_database.setdefault(database, []).append(table)
    created = []
    for database, tables in by_database.items():
        statements = source.create_statements(source_cur, database, tables)
        statement_list = jvm.java.util.ArrayList()
        for statement in statements:
            statement_list.add(statement)
        changes_json = getattr(jvm, f"{JAVA_PACKAGE}.SourceTableChanges").of(connector.type, database, statement_list)
        payload = {"ddl": ";\n".join(statements), "tableChanges": json.loads(changes_json),
                   "source": {"snapshot": "false", "db": database}}
        changes = changes_from_schema_event(payload, connector=connector.name, connector_type=connector.type,
                                            letter_casing=connector.letter_casing,
                                            destination_schema=connector.destination_schema)
        described = {change.source_table for change in changes}
        for table in tables:
            if f"{database}.{table}" not in described:
                raise CdcError(f"cannot read the definition of {database}.{table} from the source's SHOW CREATE TABLE",
                               connector=connector.name, table=f"{database}.{table}")
        for change in changes:
            change = object_map.map_change(change)
            assert change.table is not None
            for statement in create_table_sql(change.table):
                cur.execute(statement)
            rule_store.record_columns(cur, schema, connector.name, change.table)
            created.append((change.schema, change.name))
            log.info("%s: created %s.%s for %s from its definition on the source (the stream never created it)",
                     connector.name, change.schema, change.name, change.source_table)
    return created
