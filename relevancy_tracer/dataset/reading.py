"""Batch file input: the rows of a JSONL, CSV or Parquet file, a stream or standard input,
read once from start to end (:func:`read_rows`), each row its data or why it cannot be read;
what a progress bar over them can count up to (:func:`file_extent`); the file format a path
names (:func:`format_of`).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Union


@dataclass
class InputRow:
    """One input record: its 1-based line (JSONL/CSV data line) and the data or a read error;
    ``size``: the bytes it was read from (JSONL; 0 when not known); ``consumed``: the bytes of a
    JSONL or CSV input read since the previous row (a CSV header, blank lines, then this row's
    own bytes), so that summed over the rows they are exactly the input's bytes up to the end
    of the last row (0 for Parquet)."""

    line: int
    data: Optional[dict]
    error: Optional[str] = None
    size: int = 0
    consumed: int = 0


MAX_LINE_BYTES = 16 << 20
"""Longest JSONL line read (16 MiB): a longer one becomes an ``invalid_input`` row and is skipped
without being held in memory (a file with no newline cannot make the reader hold it whole)."""

_SKIP_CHUNK = 1 << 20


def format_of(path: Path, explicit: Optional[str] = None) -> str:
    """The format of a dataset file: ``explicit`` when given, else the one its suffix names:
    ``"jsonl"`` (``.jsonl``, ``.ndjson``, ``.json``), ``"csv"`` (``.csv``, ``.tsv``) or
    ``"parquet"`` (``.parquet``, ``.pq``). Raises ``ValueError`` for any other suffix."""
    if explicit:
        return explicit
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path} (use .jsonl, .csv or .parquet, or --format)")


MAX_JSON_DEPTH = 200
"""Deepest nesting of arrays and objects a JSONL line may have; deeper lines are reported as
invalid (``json`` itself fails with RecursionError near 1000 levels, and output rows are
serialised again further down the stack)."""


def _json_problem(value: Any, limit: int) -> Optional[str]:
    """What makes parsed JSON unusable, or None: lists/dicts nested more than ``limit`` levels,
    or a string holding a lone surrogate (a ``"\\ud800"`` escape: not Unicode text, which no
    model API accepts)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "a string with a lone surrogate (\\u escape of half a UTF-16 pair)"
        elif isinstance(item, (dict, list)):
            if depth > limit:
                return f"JSON nested deeper than {limit} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def _lines(stream: BinaryIO, limit: int) -> Iterator[tuple[Optional[bytes], int]]:
    """(line, its size in bytes) for the lines of ``stream`` (with their newline); None in place
    of a line longer than ``limit`` bytes, whose rest is read and dropped in chunks: memory
    O(``limit``)."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while True:  # too long: drop the rest of it
            rest = stream.readline(_SKIP_CHUNK)
            size += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield None, size


def _utf8_size(text: str) -> int:
    """The bytes ``text`` was decoded from (UTF-8 with ``surrogateescape``: exact), encoded
    back :data:`_SKIP_CHUNK` characters at a time so a huge line is not copied whole."""
    if text.isascii():
        return len(text)
    chunks = (text[i : i + _SKIP_CHUNK] for i in range(0, len(text), _SKIP_CHUNK))
    return sum(len(chunk.encode("utf-8", "surrogateescape")) for chunk in chunks)


def _jsonl_row(number: int, raw: bytes) -> Optional[InputRow]:
    """One JSONL line as an InputRow (None for a blank line); never raises."""
    try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        return InputRow(number, None, f"line {number}: not UTF-8 (byte {exc.start + 1}: {raw[exc.start:exc.start + 1]!r})")
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except RecursionError:
        return InputRow(number, None, f"line {number}: JSON nested too deeply")
    except ValueError as exc:
        return InputRow(number, None, f"line {number}: not JSON ({exc})")
    if not isinstance(data, dict):
        return InputRow(number, None, f"line {number}: expected a JSON object, got {type(data).__name__}")
    problem = _json_problem(data, MAX_JSON_DEPTH)
    if problem is not None:
        return InputRow(number, None, f"line {number}: {problem}")
    return InputRow(number, data, size=len(raw))


def _not_utf8(record: dict) -> Optional[str]:
    """The first field of a CSV record (read with ``surrogateescape``) holding bytes that are
    not UTF-8, or None."""
    for key, value in record.items():
        for text in (key, value) if not isinstance(value, list) else (key, *value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")
    return None


def _csv_rows(handle: BinaryIO, delimiter: str, bom: bool) -> Iterator[InputRow]:
    """The records of a CSV input, each with the bytes read for it (``consumed``); ``bom``:
    the input starts with a UTF-8 byte-order mark (3 bytes the decoder drops)."""
    # Fields are as long as the data has them: the csv module's default cap (128 KiB) would
    # abort the whole run on one long answer; the length limits apply later, when scoring.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the first column's name
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="surrogateescape", newline="")
    read = len(codecs.BOM_UTF8) if bom else 0  # bytes of the lines the reader took so far

    def counted() -> Iterator[str]:
        nonlocal read
        for line in text:
            read += _utf8_size(line)
            yield line

    reader = csv.DictReader(counted(), delimiter=delimiter)
    number, reported = 1, 0
    while True:
        number += 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            row = InputRow(number, None, f"line {number}: not CSV ({exc})")
        else:
            column = _not_utf8(record)
            if column is not None:
                row = InputRow(number, None, f"line {number}: not UTF-8 (column {column!r})")
            else:
                row = InputRow(number, dict(record))
        row.consumed, reported = read - reported, read
        yield row


STDIN = "-"
"""The input path that means standard input (read as JSONL unless a format is given)."""

SNIFF_BYTES = 8192
"""How much of a JSONL/CSV input is checked for a NUL byte (a binary file) before any row is read."""


class _Replay(io.RawIOBase):
    """A read-once stream with its first bytes already read (``head``) put back in front: what
    is sniffed from a pipe or FIFO is not lost, and the input is never opened twice."""

    def __init__(self, head: bytes, rest: BinaryIO):
        super().__init__()
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        read = getattr(self._rest, "read1", self._rest.read)
        data = read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _open_input(path: Union[str, Path]) -> tuple[BinaryIO, bool]:
    """The input as a binary stream, opened once, and whether to close it (not standard input)."""
    if str(path) == STDIN:
        return sys.stdin.buffer, False
    return open(path, "rb"), True


def _read_head(handle: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes from the start of a stream (fewer only at its end)."""
    parts, have = [], 0
    while have < size:
        data = handle.read(size - have)
        if not data:
            break
        parts.append(data)
        have += len(data)
    return b"".join(parts)


#: Rows of a Parquet file converted to Python at a time (see :func:`read_rows`).
PARQUET_BATCH_ROWS = 1024


def read_rows(path: Union[str, Path], fmt: Optional[str] = None) -> Iterator[InputRow]:
    """Records of a JSONL, CSV or Parquet file, in file order.

    ``path`` may be a regular file or a stream (a FIFO, ``/dev/stdin``, a process substitution),
    or ``"-"`` for standard input (JSONL unless ``fmt`` says otherwise): the input is opened
    once and read once, from its start to its end, so nothing a pipe delivers is lost. A
    UTF-8 byte-order mark at the start of a JSONL or CSV input is skipped.

    A line that cannot be read (not UTF-8, not JSON, not an object, nested deeper than
    :data:`MAX_JSON_DEPTH`, a string with a lone surrogate; a CSV record that is not UTF-8 or
    not CSV) is an ``InputRow`` with ``error`` set and its line number, not an exception;
    blank JSONL lines are skipped. CSV fields may be of any length.

    Raises ``OSError`` when the file cannot be opened, ``ValueError`` for an unknown format or a
    JSONL/CSV file that is binary (a NUL byte in its first :data:`SNIFF_BYTES` bytes), and
    ``ImportError`` for Parquet without pyarrow. A Parquet file is read
    :data:`PARQUET_BATCH_ROWS` rows at a time (at most a row group in memory); Parquet from a
    stream is read into memory whole (its footer is at the end)."""
    stdin = str(path) == STDIN
    path = Path(path)
    kind = format_of(path, fmt or ("jsonl" if stdin else None))
    name = "standard input" if stdin else str(path)
    if kind == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("Parquet needs pyarrow: pip install 'relevancy-tracer[pandas]'") from exc
    handle, owned = _open_input(path)
    try:
        if kind == "parquet":
            source = handle if handle.seekable() else pa.BufferReader(handle.read())
            number = 0
            for batch in pq.ParquetFile(source).iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for record in batch.to_pylist():
                    number += 1
                    yield InputRow(number, record)
            return
        head = _read_head(handle, SNIFF_BYTES)
        if b"\0" in head:  # as git and grep tell binary files: a NUL byte
            raise ValueError(f"{name} is not a text file (it holds NUL bytes), so not {kind.upper()}")
        stream = io.BufferedReader(_Replay(head, handle))
        if kind == "jsonl":
            pending = 0  # bytes read since the last row: blank lines, then this one
            for number, (raw, size) in enumerate(_lines(stream, MAX_LINE_BYTES), start=1):
                pending += size
                row = InputRow(number, None, f"line {number}: longer than {MAX_LINE_BYTES >> 20} MiB (skipped)") if raw is None else _jsonl_row(number, raw)
                if row is not None:
                    row.consumed, pending = pending, 0
                    yield row
        else:
            bom = head.startswith(codecs.BOM_UTF8)
            yield from _csv_rows(stream, "\t" if path.suffix.lower() == ".tsv" else ",", bom)
    finally:
        if owned:
            handle.close()


def file_extent(path: Union[str, Path], fmt: Optional[str] = None) -> Optional[tuple[str, int]]:
    """What a progress bar over :func:`read_rows` of ``path`` can count up to, known without
    reading the rows: ``("bytes", size)`` for a regular JSONL or CSV file (the rows'
    ``consumed`` bytes add up to it, less any blank lines after the last row),
    ``("rows", count)`` for a regular Parquet file (its footer's row count). None for standard
    input or anything but a regular file (a FIFO or pipe is read once, by the scorer), and
    when it cannot be told. Never raises: a progress total is never worth an error."""
    if str(path) == STDIN:
        return None
    path = Path(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None
        if format_of(path, fmt) != "parquet":
            return "bytes", info.st_size
        import pyarrow.parquet as pq

        return "rows", int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:
        return None


def same_file(first: Union[str, Path], second: Union[str, Path]) -> bool:
    """Whether two paths name one file: the same path, a symlink to it, or a hard link (same
    device and inode). False when either does not exist."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False

