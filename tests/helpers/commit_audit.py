"""An audit of every destination commit: a deferred constraint trigger on a destination table records, when each
transaction that changed it commits, the sum of a column as that commit left it (`public.commits_seen`). A test of
whole source transactions checks that every commit left a total some source transaction committed."""

from __future__ import annotations

import psycopg


def audit_commits(dsn: str, table: str, column: str = "balance") -> None:
    """Installs the audit on `table` (a qualified, quoted name) of the destination database at `dsn`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE public.commits_seen (txid bigint PRIMARY KEY, total bigint NOT NULL);
            CREATE FUNCTION public.audit_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.commits_seen SELECT txid_current(), sum({column}) FROM {table}
                    ON CONFLICT (txid) DO NOTHING;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER audit_commit AFTER INSERT OR UPDATE OR DELETE ON {table}
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.audit_commit();""")


def totals_committed(dsn: str) -> list[int]:
    """The total each audited commit left, in commit order."""
    with psycopg.connect(dsn) as conn:
        return [int(row[0]) for row in conn.execute("SELECT total FROM public.commits_seen ORDER BY txid")]
