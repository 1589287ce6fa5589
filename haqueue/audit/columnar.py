"""A closed audit event file (JSON lines, schema.py) as Parquet: what `haqueue audit lag` reads fastest.

pyarrow alone, no JVM, in bounded memory (a block of lines and a row group at a time), so that it can run
beside a broker (`haqueue audit ship` converts the files it ships). The audit reads `NAME.parquet` files
beside `NAME.jsonl` ones (sources.read_events) and, where a file is there in both forms, the Parquet one.

A line that pyarrow reads as a JSON object of the events' types is a row of those fields. Any other line
(torn by a crash, not JSON, a field of another type) is kept as it was, as text in the `_corrupt_record`
column with every field null: the audit parses such lines as it parses JSON lines, so each is counted in
bad_input with its file and problem, as it would be from the JSONL file, and none is lost. Blank lines are
left out, as Spark's JSON reader leaves them out.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from haqueue.audit import parts, schema

BLOCK = 8 << 20  # bytes of lines parsed at a time
ROW_GROUP = 1 << 17  # rows per row group: ~25 MB of rows in memory before they are written

_TYPES = {"BIGINT": pa.int64(), "STRING": pa.string(), "BOOLEAN": pa.bool_(), "ARRAY<STRING>": pa.list_(pa.string())}
FIELDS = pa.schema([(name, _TYPES[kind]) for name, kind in schema.FIELDS.items()])
SCHEMA = FIELDS.append(pa.field(schema.CORRUPT, pa.string()))  # a Parquet event file's columns
_PARSE = pj.ParseOptions(explicit_schema=FIELDS, unexpected_field_behavior="ignore")


@dataclass(frozen=True)
class Counts:
    """What a conversion wrote."""

    rows: int  # lines written as events' fields
    kept: int  # lines kept as text (the audit counts them in bad_input, as from JSON lines)


def convert(source: str | BinaryIO, destination: str | BinaryIO) -> Counts:
    """Write the event lines of `source` (a path, or a binary file open for reading, read to its end) as a
    Parquet file to `destination` (a path, or a binary file open for writing, left open): columns SCHEMA,
    zstd, ROW_GROUP rows a group. Raises OSError if either cannot be read or written, and NewerFormat if the
    name of `source` (a path) says a format this build does not read; a line it cannot parse is kept, never
    an error."""
    if isinstance(source, str):
        parts.check_format(source)
    rows = kept = 0
    with (open(source, "rb") if isinstance(source, str) else contextlib.nullcontext(source)) as lines, \
            pq.ParquetWriter(destination, SCHEMA, compression="zstd") as writer:
        group = _RowGroup(writer)
        for block in _blocks(lines):
            for part in _parsed(block):
                group.add(part)
                if isinstance(part, str):
                    kept += 1
                else:
                    rows += part.num_rows
        group.flush()
    return Counts(rows, kept)


def _blocks(file: BinaryIO) -> Iterator[bytes]:
    """`file` in blocks of whole lines of about BLOCK bytes; the last may end without a newline."""
    rest = b""
    while data := file.read(BLOCK):
        data = rest + data
        end = data.rfind(b"\n") + 1
        if end:
            yield data[:end]
        rest = data[end:]
    if rest:
        yield rest


def _parsed(block: bytes) -> Iterator[pa.Table | str]:
    """The lines of `block` in order: runs of parsed lines as tables, each other line as its text. A block
    that does not parse as one row per line is halved until the lines that do not are alone."""
    lines = block.count(b"\n") + (not block.endswith(b"\n"))
    # pyarrow reads only blocks whose every line starts an object: a line `null` crashes its reader
    if block.startswith(b"{") + block.count(b"\n{") == lines:
        try:
            table = pj.read_json(io.BytesIO(block), pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
                                 _PARSE)
        except pa.ArrowInvalid:
            table = None
        if table is not None and table.num_rows == lines:  # not two objects on a line
            yield table
            return
    if lines == 1:
        text = block.rstrip(b"\r\n")
        if text.strip():  # a blank line is no line
            yield text.decode("utf-8", errors="replace")
    else:  # at the first newline after the middle, unless it ends the block: the last one before it
        cut = block.find(b"\n", len(block) // 2, len(block) - 1)
        cut = cut if cut >= 0 else block.rfind(b"\n", 0, len(block) - 1)
        yield from _parsed(block[:cut + 1])
        yield from _parsed(block[cut + 1:])


class _RowGroup:
    """Parsed rows and kept lines, in order, written a row group at a time."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.tables: list[pa.Table] = []
        self.kept: list[str] = []
        self.rows = 0

    def add(self, part: pa.Table | str) -> None:
        if isinstance(part, str):
            self.kept.append(part)
            self.rows += 1
        else:
            self._keep()
            self.tables.append(part.append_column(SCHEMA.field(schema.CORRUPT), pa.nulls(part.num_rows, pa.string())))
            self.rows += part.num_rows
        if self.rows >= ROW_GROUP:
            self.flush()

    def _keep(self) -> None:
        """The kept lines so far as a table: every field null, the line in the CORRUPT column."""
        if self.kept:
            columns = [pa.nulls(len(self.kept), field.type) for field in FIELDS]
            self.tables.append(pa.Table.from_arrays([*columns, pa.array(self.kept, pa.string())], schema=SCHEMA))
            self.kept = []

    def flush(self) -> None:
        self._keep()
        if self.tables:
            self.writer.write_table(pa.concat_tables(self.tables), row_group_size=ROW_GROUP)
            self.tables, self.rows = [], 0
