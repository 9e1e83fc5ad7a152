"""DDL text (MySQL/MariaDB's, and Oracle's with `dialect=ORACLE`), shared by the source packages that have it, read just enough to find what a Debezium schema change's table definitions cannot tell:
column and table renames (`parse_renames`) and unique keys (`parse_unique_keys`), and which statements of a text
are about a table (`statements_about`). A tokenizer of our own: it skips what it does not need, so a statement with
syntax it does not know still gives its renames and keys (sqlglot was measured against it: docs/ddl-and-mapping.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

QualifiedName = tuple[str | None, str]


@dataclass(frozen=True)
class DdlRenames:
    """Renames a DDL text performs, in source names: columns as (old, new), tables as (old db, old, new db, new)."""

    columns: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str | None, str, str | None, str]] = field(default_factory=list)


@dataclass(frozen=True)
class UniqueKeyChanges:
    """Unique keys a DDL text declares, as (key name or None, source columns), and index names it drops."""

    added: list[tuple[str | None, tuple[str, ...]]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def parse_renames(ddl_text: str) -> DdlRenames:
    """Return the column and table renames of a MySQL/MariaDB DDL text, in statement order.

    Columns come from `RENAME COLUMN a TO b` and `CHANGE [COLUMN] a b ...` (when the name differs);
    tables from `RENAME TABLE a TO b, ...` and `ALTER TABLE a RENAME [TO|AS] b`. Names inside string
    literals and comments are not renames.
    """
    renames = DdlRenames()
    for statement in parse_statements(ddl_text):
        renames.columns.extend(statement.column_renames)
        renames.tables.extend(statement.table_renames)
    return renames


def parse_unique_keys(ddl_text: str) -> UniqueKeyChanges:
    """Return the unique keys a MySQL/MariaDB DDL text declares and the index names it drops.

    Keys come from CREATE TABLE (column-level UNIQUE, table-level UNIQUE / CONSTRAINT ... UNIQUE),
    ALTER TABLE ADD [CONSTRAINT ...] UNIQUE or a column added or changed with UNIQUE, and CREATE
    UNIQUE INDEX; drops from DROP INDEX / DROP KEY / DROP CONSTRAINT. Prefix lengths are ignored.
    """
    changes = UniqueKeyChanges()
    for statement in parse_statements(ddl_text):
        changes.added.extend(statement.unique_added)
        changes.dropped.extend(statement.unique_dropped)
    return changes


# MySQL/MariaDB DDL text: just enough of a parser to find renames and unique keys.

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>(?:--(?=\s|$)|\#)[^\n]*|/\*(?!M?!).*?(?:\*/|\Z))
    | (?P<executable>/\*M?!\d*|\*/)
    | (?P<name>`(?:[^`]|``)*(?:`|\Z))
    | (?P<string>'(?:[^'\\]|\\.|'')*(?:'|\Z)|"(?:[^"\\]|\\.|"")*(?:"|\Z))
    | (?P<word>[\w$]+)
    | (?P<symbol>.)
    """,
    re.VERBOSE | re.DOTALL,
)
# Oracle's text (LogMiner's DDL as it was run): "..." quotes a name kept as written, an unquoted name is stored upper
# case, '...' is a string (N'...' national); no backticks, no # comments, no executable comments.
_ORACLE_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
    | (?P<name>"[^"]*(?:"|\Z))
    | (?P<string>[Nn]?'(?:[^']|'')*(?:'|\Z))
    | (?P<word>[\w$#]+)
    | (?P<symbol>.)
    """,
    re.VERBOSE | re.DOTALL,
)
MYSQL, ORACLE = "mysql", "oracle"
_NOT_A_COLUMN = {"CONSTRAINT", "PRIMARY", "UNIQUE", "INDEX", "KEY", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK"}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str

    def keyword(self) -> str | None:
        return self.text.upper() if self.kind == "word" else None


@dataclass
class Statement:
    """What one DDL statement does to which table (`table`, and `renamed_to` when it renames it)."""

    table: QualifiedName | None = None
    renamed_to: QualifiedName | None = None
    column_renames: list[tuple[str, str]] = field(default_factory=list)
    table_renames: list[tuple[str | None, str, str | None, str]] = field(default_factory=list)
    unique_added: list[tuple[str | None, tuple[str, ...]]] = field(default_factory=list)
    unique_dropped: list[str] = field(default_factory=list)


class _Cursor:
    """Reads a token list left to right; `accept` consumes a keyword when it is next."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0

    def keyword(self, offset: int = 0) -> str | None:
        index = self.index + offset
        return self.tokens[index].keyword() if index < len(self.tokens) else None

    def at_symbol(self, symbol: str) -> bool:
        return self.index < len(self.tokens) and self.tokens[self.index] == _Token("symbol", symbol)

    def accept(self, *keywords: str) -> bool:
        if self.keyword() in keywords:
            self.index += 1
            return True
        return False

    def accept_all(self, *keywords: str) -> bool:
        if all(self.keyword(offset) == keyword for offset, keyword in enumerate(keywords)):
            self.index += len(keywords)
            return True
        return False

    def name(self) -> str | None:
        if self.index < len(self.tokens) and self.tokens[self.index].kind in ("word", "name"):
            self.index += 1
            return self.tokens[self.index - 1].text
        return None

    def qualified_name(self) -> QualifiedName | None:
        first = self.name()
        if first is None:
            return None
        if self.at_symbol(".") and self.index + 1 < len(self.tokens):
            self.index += 1
            second = self.name()
            if second is not None:
                return first, second
        return None, first

    def parenthesised(self) -> list[list[_Token]] | None:
        """Consume `( ... )` and return its comma-separated items."""
        if not self.at_symbol("("):
            return None
        depth = 0
        for index in range(self.index, len(self.tokens)):
            token = self.tokens[index]
            if token.kind == "symbol" and token.text in "()":
                depth += 1 if token.text == "(" else -1
                if depth == 0:
                    inner = self.tokens[self.index + 1 : index]
                    self.index = index + 1
                    return _split(inner, ",")
        return None

    def rest(self) -> list[_Token]:
        rest = self.tokens[self.index :]
        self.index = len(self.tokens)
        return rest

    def skip_wait(self) -> None:
        if self.accept("WAIT"):
            self.index += 1
        else:
            self.accept("NOWAIT")


def _tokens(ddl_text: str, dialect: str = MYSQL) -> list[_Token]:
    tokens = []
    for match in (_ORACLE_TOKEN if dialect == ORACLE else _TOKEN).finditer(ddl_text):
        kind = match.lastgroup or "symbol"
        text = match.group()
        if kind in ("space", "comment", "executable"):
            continue
        if kind == "name":
            quote = text[0]
            text = text[1:-1] if len(text) > 1 and text.endswith(quote) else text[1:]
            text = text.replace(quote * 2, quote)
        elif kind == "word" and dialect == ORACLE:
            text = text.upper()
        tokens.append(_Token(kind, text))
    return tokens


def _split(tokens: list[_Token], separator: str) -> list[list[_Token]]:
    """Split at `separator` symbols outside parentheses, dropping empty pieces."""
    pieces: list[list[_Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.kind == "symbol" and token.text in "()":
            depth += 1 if token.text == "(" else -1
        if depth == 0 and token == _Token("symbol", separator):
            pieces.append([])
        else:
            pieces[-1].append(token)
    return [piece for piece in pieces if piece]


def parse_statements(ddl_text: str, dialect: str = MYSQL) -> list[Statement]:
    """What each statement of a DDL text does (`Statement`). `dialect` ORACLE reads Oracle's text: names quoted with
    "..." kept as written, unquoted ones upper case as Oracle stores them, and `RENAME a TO b` renames a table; the
    statements both share (ALTER TABLE ... RENAME COLUMN / RENAME TO / ADD [CONSTRAINT c] UNIQUE / ADD (columns) /
    DROP CONSTRAINT, CREATE TABLE, CREATE UNIQUE INDEX) read alike."""
    statements = []
    for tokens in _split(_tokens(ddl_text, dialect), ";"):
        statement = _parse_statement(_Cursor(tokens), dialect)
        if statement is not None:
            statements.append(statement)
    return statements


def _parse_statement(cursor: _Cursor, dialect: str = MYSQL) -> Statement | None:
    if cursor.accept("CREATE"):
        cursor.accept_all("OR", "REPLACE")
        cursor.accept("TEMPORARY")
        if cursor.accept("TABLE"):
            return _parse_create_table(cursor)
        cursor.accept("ONLINE", "OFFLINE")
        if cursor.accept("UNIQUE") and cursor.accept("INDEX", "KEY"):
            return _parse_create_unique_index(cursor)
    elif cursor.accept("ALTER"):
        cursor.accept("ONLINE")
        cursor.accept("IGNORE")
        if cursor.accept("TABLE"):
            return _parse_alter_table(cursor)
    elif cursor.accept("RENAME"):
        if cursor.accept("TABLE", "TABLES") or dialect == ORACLE:
            return _parse_rename_table(cursor)
    elif cursor.accept("DROP"):
        cursor.accept("ONLINE", "OFFLINE")
        if cursor.accept("INDEX"):
            return _parse_drop_index(cursor)
    return None


def _parse_create_table(cursor: _Cursor) -> Statement | None:
    cursor.accept_all("IF", "NOT", "EXISTS")
    table = cursor.qualified_name()
    if table is None:
        return None
    statement = Statement(table=table)
    for item in cursor.parenthesised() or ():
        definition = _Cursor(item)
        if definition.accept("CONSTRAINT"):
            symbol = None if definition.keyword() in _NOT_A_COLUMN else definition.name()
            if definition.accept("UNIQUE"):
                _add_unique_key(statement, definition, symbol)
        elif definition.accept("UNIQUE"):
            _add_unique_key(statement, definition, None)
        elif definition.keyword() not in _NOT_A_COLUMN and definition.keyword(1) != "FOR":
            _add_column_unique_key(statement, definition)
    return statement


def _parse_create_unique_index(cursor: _Cursor) -> Statement | None:
    cursor.accept_all("IF", "NOT", "EXISTS")
    index = cursor.name()
    if cursor.accept("USING"):
        cursor.name()
    if index is None or not cursor.accept("ON"):
        return None
    table = cursor.qualified_name()
    if table is None:
        return None
    statement = Statement(table=table)
    columns = _key_columns(cursor)
    if columns:
        statement.unique_added.append((index, columns))
    return statement


def _parse_drop_index(cursor: _Cursor) -> Statement | None:
    cursor.accept_all("IF", "EXISTS")
    index = cursor.name()
    if index is None or not cursor.accept("ON"):
        return None
    table = cursor.qualified_name()
    if table is None:
        return None
    return Statement(table=table, unique_dropped=[] if index.upper() == "PRIMARY" else [index])


def _parse_rename_table(cursor: _Cursor) -> Statement:
    cursor.accept_all("IF", "EXISTS")
    statement = Statement()
    for item in _split(cursor.rest(), ","):
        pair = _Cursor(item)
        old = pair.qualified_name()
        pair.skip_wait()
        new = pair.qualified_name() if pair.accept("TO") else None
        if old is not None and new is not None:
            statement.table_renames.append((old[0], old[1], new[0], new[1]))
    return statement


def _parse_alter_table(cursor: _Cursor) -> Statement | None:
    cursor.accept_all("IF", "EXISTS")
    table = cursor.qualified_name()
    if table is None:
        return None
    cursor.skip_wait()
    statement = Statement(table=table)
    for item in _split(cursor.rest(), ","):
        _parse_alter_specification(_Cursor(item), statement, table)
    return statement


def _parse_alter_specification(spec: _Cursor, statement: Statement, table: QualifiedName) -> None:
    if spec.accept("RENAME"):
        if spec.accept("COLUMN"):
            spec.accept_all("IF", "EXISTS")
            old = spec.name()
            new = spec.name() if spec.accept("TO") else None
            if old is not None and new is not None:
                statement.column_renames.append((old, new))
        elif not spec.accept("INDEX", "KEY", "CONSTRAINT"):
            spec.accept("TO", "AS")
            new_table = spec.qualified_name()
            if new_table is not None:
                statement.table_renames.append((table[0], table[1], new_table[0], new_table[1]))
                statement.renamed_to = new_table
    elif spec.accept("CHANGE"):
        spec.accept("COLUMN")
        spec.accept_all("IF", "EXISTS")
        old = spec.name()
        if old is not None and spec.index < len(spec.tokens) and spec.tokens[spec.index].kind in ("word", "name"):
            new = spec.tokens[spec.index].text
            if old != new:
                statement.column_renames.append((old, new))
            _add_column_unique_key(statement, spec)
    elif spec.accept("MODIFY"):
        spec.accept("COLUMN")
        spec.accept_all("IF", "EXISTS")
        _add_column_unique_key(statement, spec)
    elif spec.accept("ADD"):
        _parse_alter_add(spec, statement)
    elif spec.accept("DROP"):
        if spec.accept("INDEX", "KEY", "CONSTRAINT"):
            spec.accept_all("IF", "EXISTS")
            index = spec.name()
            if index is not None and index.upper() != "PRIMARY":
                statement.unique_dropped.append(index)


def _parse_alter_add(spec: _Cursor, statement: Statement) -> None:
    if spec.accept("CONSTRAINT"):
        spec.accept_all("IF", "NOT", "EXISTS")
        symbol = None if spec.keyword() in _NOT_A_COLUMN else spec.name()
        if spec.accept("UNIQUE"):
            _add_unique_key(statement, spec, symbol)
    elif spec.accept("UNIQUE"):
        _add_unique_key(statement, spec, None)
    elif spec.keyword() in _NOT_A_COLUMN | {"PARTITION", "SYSTEM"} or spec.keyword(1) == "FOR":
        return
    else:
        spec.accept("COLUMN")
        spec.accept_all("IF", "NOT", "EXISTS")
        items = spec.parenthesised() if spec.at_symbol("(") else [spec.rest()]
        for item in items or ():
            _add_column_unique_key(statement, _Cursor(item))


def _add_unique_key(statement: Statement, cursor: _Cursor, symbol: str | None) -> None:
    """Read `[INDEX|KEY] [IF NOT EXISTS] [name] [USING type] (columns)`; the index name wins over the constraint's."""
    cursor.accept("INDEX", "KEY")
    cursor.accept_all("IF", "NOT", "EXISTS")
    name = None if cursor.at_symbol("(") or cursor.keyword() == "USING" else cursor.name()
    if cursor.accept("USING"):
        cursor.name()
    columns = _key_columns(cursor)
    if columns:
        statement.unique_added.append((name or symbol, columns))


def _key_columns(cursor: _Cursor) -> tuple[str, ...] | None:
    """The column of each key part, without prefix length or order; None for an expression key."""
    columns = []
    for part in cursor.parenthesised() or ():
        if part[0].kind not in ("word", "name"):
            return None
        columns.append(part[0].text)
    return tuple(columns) or None


def _add_column_unique_key(statement: Statement, definition: _Cursor) -> None:
    """A column definition (name first) declaring UNIQUE [KEY] outside parentheses adds a key on that column."""
    column = definition.name()
    if column is None:
        return
    depth = 0
    for token in definition.rest():
        if token.kind == "symbol" and token.text in "()":
            depth += 1 if token.text == "(" else -1
        elif depth == 0 and token.keyword() == "UNIQUE":
            statement.unique_added.append((None, (column,)))
            return


def statements_about(statements: list[Statement], parts: tuple[str, ...]) -> list[Statement]:
    return [
        statement
        for statement in statements
        if any(name is not None and names_table(name, parts) for name in (statement.table, statement.renamed_to))
    ]


def names_table(name: QualifiedName, parts: tuple[str, ...]) -> bool:
    """Whether a name from the DDL text is the table of a Debezium id; MariaDB may ignore the letter case."""
    database, table = name
    if table.casefold() != parts[-1].casefold():
        return False
    return database is None or len(parts) < 2 or database.casefold() == parts[-2].casefold()
