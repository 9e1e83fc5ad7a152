"""What the tests share: the project's paths, the pipelines of each source type (`mariadb_source`,
`postgres_source`), killing runs (`runs`), Spark and captured Debezium events (`spark`), value comparison."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = PROJECT_ROOT / "tests" / "fixtures"
