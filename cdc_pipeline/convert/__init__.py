"""Convert: source types to PostgreSQL types, schema changes to DDL, row images to COPY text (Spark)."""
