"""Tooling around the engine, never imported by it: throwaway MariaDB and PostgreSQL servers (the tests, the demo
and the bench start them), the demo, and the bench (`cdc-pipeline bench`)."""
