"""The shape of a source type's Debezium offset, which each source module declares (`OFFSET_SHAPE`): what
`set_offset` checks an operator's offset against."""

from __future__ import annotations

from dataclasses import dataclass

INT = (int,)
TEXT = (str,)
FLAG = (bool, str)


@dataclass(frozen=True)
class OffsetShape:
    """The fields of one connector type's Debezium offset: required with their types, and the optional ones."""

    required: dict[str, tuple[type, ...]]
    optional: dict[str, tuple[type, ...]]
    example: str
