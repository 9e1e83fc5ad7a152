"""Each source table a connector replicates as an external asset, upstream of its destination table's asset, and its
row count as the source's catalog estimates it, observed by the change sensor (`assets/observations.py`).

The key is the source type, the database and the table's own name parts: `mariadb/<database>/<table>` (a
MariaDB/MySQL table is named `database.table`), `postgres/<database>/<schema>/<table>`, and likewise
`sqlserver/<database>/<schema>/<table>` and `oracle/<database>/<schema>/<table>`. The server is not in the key:
connectors reading the same database and table share one asset, whatever server they name (two servers holding a
database of the same name show as one asset). Nothing materializes a source asset: Dagster shows it as external,
with its observations.
"""

from __future__ import annotations

from typing import Iterable

from dagster import AssetKey, AssetSpec, MetadataValue

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.ops.tables import ReplicatedTable

SOURCES_GROUP = "sources"
# The source types whose table names begin with their database (`database.table`).
DATABASE_QUALIFIED = ("mariadb", "mysql")


def source_asset_key(connector: ConnectorConfig, source_table: str) -> AssetKey:
    parts = source_table.split(".")
    if connector.type in DATABASE_QUALIFIED:
        return AssetKey([connector.type, *parts])
    if len(parts) > 2 and parts[0].lower() == connector.database.lower():
        parts = parts[1:]
    return AssetKey([connector.type, connector.database, *parts])


def source_keys(connector: ConnectorConfig, table: ReplicatedTable) -> list[AssetKey]:
    """The source assets a destination table is made from: its source table, and those merged into it."""
    return [source_asset_key(connector, source_table) for source_table in table.source_tables]


def build_source_specs(tables: Iterable[tuple[ConnectorConfig, ReplicatedTable]]) -> list[AssetSpec]:
    """One external asset per source table, however many connectors or destination tables read it."""
    readers: dict[AssetKey, list[tuple[ConnectorConfig, str]]] = {}
    for connector, table in tables:
        for source_table in table.source_tables:
            readers.setdefault(source_asset_key(connector, source_table), []).append((connector, source_table))
    specs = []
    for key, read_by in readers.items():
        connector, source_table = read_by[0]
        servers = sorted({f"{reader.hostname}:{reader.port}" for reader, _ in read_by})
        names = sorted({reader.name for reader, _ in read_by})
        specs.append(AssetSpec(
            key=key, group_name=SOURCES_GROUP, kinds={connector.type},
            description=f"{connector.type} table {source_table} in database {key.path[1]} on "
                        f"{', '.join(servers)}, read by connector{'s' if len(names) > 1 else ''} {', '.join(names)}.",
            metadata={"source_table": source_table, "connectors": MetadataValue.json(names),
                      "servers": MetadataValue.json(servers)}))
    return specs
