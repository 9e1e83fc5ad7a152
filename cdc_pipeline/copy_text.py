"""PostgreSQL's COPY text format as Spark column expressions: the NULL marker, a text value's escapes, and a
geometry's EWKB. Every path that writes COPY lines uses them: the stream's conversion, the bulk snapshot's per
source type, the transforms and the merge's staging."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

NULL_TEXT = "\\N"


# The characters COPY text escapes and their escapes, in the order they are replaced (the backslash first). The
# sources that render COPY text in their own SQL (`copy_text_sql`) replace the same ones.
ESCAPES = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))

# How the runner's SourceChunkCopier writes a field a source selected for a bulk snapshot (`copy_field_sql`) as COPY
# text, NULL as `\N` in each case: as it is (a number), escaped as `copy_escape` does (a text value), a zero date as
# NULL (a date), or binary bytes as bytea's hex text (`\\x` and lower-case hex digits: the source sends the bytes,
# half the hex text's size, and a value of any size the server can send). The codes are the copier's
# (SourceChunkCopier.PLAIN, TEXT, DATE, BYTEA).
FIELD_PLAIN, FIELD_TEXT, FIELD_DATE, FIELD_BYTEA = 0, 1, 2, 3


def copy_escape(text: Column) -> Column:
    """Escapes a text value for COPY text format (backslash, newline, carriage return, tab), and takes out NUL
    characters: PostgreSQL's text types cannot hold them (a MariaDB/MySQL string may), and a value with one would
    stop the connector on every run."""
    escaped = F.replace(text, F.lit("\u0000"), F.lit(""))
    for char, escape in ESCAPES:
        escaped = F.replace(escaped, F.lit(char), F.lit(escape))
    return escaped


_EWKB_SRID_FLAG = 0x20000000


def _reverse_octets(hex_digits: Column) -> Column:
    return F.array_join(F.reverse(F.regexp_extract_all(hex_digits, F.lit("(..)"), 1)), "")


def ewkb_hex(wkb_hex: Column, srid: Column) -> Column:
    """WKB (hex) with its SRID put in as EWKB does: the SRID flag in the type word, the SRID after it, both in
    the WKB's own byte order (its first octet: 01 little-endian, 00 big-endian)."""
    little_endian = F.substring(wkb_hex, 1, 2) == "01"
    type_word = F.substring(wkb_hex, 3, 8)
    type_big_endian = F.when(little_endian, _reverse_octets(type_word)).otherwise(type_word)
    flagged = F.lpad(F.lower(F.conv(
        F.conv(type_big_endian, 16, 10).cast("long").bitwiseOR(F.lit(_EWKB_SRID_FLAG)).cast("string"), 10, 16)), 8, "0")
    srid_big_endian = F.lpad(F.lower(F.conv(srid.cast("string"), 10, 16)), 8, "0")

    def in_order(word: Column) -> Column:
        return F.when(little_endian, _reverse_octets(word)).otherwise(word)

    ewkb = F.concat(F.substring(wkb_hex, 1, 2), in_order(flagged), in_order(srid_big_endian),
                    F.substring(wkb_hex, 11, 1 << 30))
    return F.when(srid.isNull() | (srid == 0), wkb_hex).otherwise(ewkb)
