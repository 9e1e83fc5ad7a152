"""Operations: the CLI (no Dagster), requests, change checks, stats, dead letters, row counts."""
