"""Datasets for batch scoring: column mapping, and JSONL / CSV / Parquet input and output.

Column mapping: by default the columns ``question``/``answer``/``contexts`` or the names of
RAGAS's ``ResponseRelevancy`` (``user_input``/``response``/``retrieved_contexts``, as wrappers
of it such as ValidMind's use them) are used; a column can instead be named explicitly, given as a dotted path
into nested JSON (``prediction.generated_answer``, ``messages.0.content``), or given as a
callable ``fn(row) -> value``.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Optional, Union

Column = Union[str, Callable[[Any], Any], None]

DEFAULT_QUESTION_COLUMNS = ("question", "user_input", "query")
DEFAULT_ANSWER_COLUMNS = ("answer", "response")
DEFAULT_CONTEXTS_COLUMNS = ("contexts", "retrieved_contexts")
DEFAULT_HISTORY_COLUMNS = ("history", "chat_history")

_MISSING = object()


def resolve_path(obj: Any, path: str) -> Any:
    """The value at ``path`` in ``obj``: a key as given, else a dotted path through mappings,
    attributes and list indices. Raises ``KeyError`` when it does not exist."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    current = obj
    for part in path.split("."):
        if isinstance(current, dict):
            if part not in current:
                raise KeyError(path)
            current = current[part]
        elif isinstance(current, (list, tuple)) and part.lstrip("-").isdigit():
            try:
                current = current[int(part)]
            except IndexError as exc:
                raise KeyError(path) from exc
        else:
            value = getattr(current, part, _MISSING)
            if value is _MISSING:
                raise KeyError(path)
            current = value
    return current


@dataclass(frozen=True)
class ColumnMapping:
    """Where question, answer, contexts and the conversation's earlier turns live in a row.

    Each field is a column name or dotted path, a callable ``fn(row)``, or None for the
    defaults (see module doc; history: ``history`` or ``chat_history``). ``extract`` raises
    ``KeyError`` when question or answer is missing; missing contexts and history are None.
    """

    question: Column = None
    answer: Column = None
    contexts: Column = None
    history: Column = None

    @staticmethod
    def _get(row: Any, column: Column, defaults: tuple[str, ...], required: bool) -> Any:
        if callable(column):
            return column(row)
        if column is not None:
            return resolve_path(row, column)
        for name in defaults:
            try:
                return resolve_path(row, name)
            except KeyError:
                continue
        if required:
            raise KeyError(f"none of the columns {', '.join(defaults)}")
        return None

    def extract(self, row: Any) -> tuple[Any, Any, Any]:
        """(question, answer, contexts) of ``row``; values are not validated here."""
        question = self._get(row, self.question, DEFAULT_QUESTION_COLUMNS, True)
        answer = self._get(row, self.answer, DEFAULT_ANSWER_COLUMNS, True)
        contexts = self._get(row, self.contexts, DEFAULT_CONTEXTS_COLUMNS, False)
        if isinstance(contexts, str) and contexts.lstrip().startswith("["):
            try:  # CSV cells hold lists as JSON text
                contexts = json.loads(contexts)
            except ValueError:
                pass
        return question, answer, contexts

    def extract_history(self, row: Any) -> Any:
        """The earlier turns of ``row`` as found (None when there is no such column): a list of
        ``{"role", "content"}`` messages, parsed from JSON text when the cell holds text (CSV),
        and a list when the cell holds an array (Parquet through pandas). Not validated here:
        :func:`~relevancy_tracer.scoring.conversation.read_history` does that."""
        value = self._get(row, self.history, DEFAULT_HISTORY_COLUMNS, False)
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                return json.loads(value)
            except ValueError:
                return value  # read_history refuses it: the row is judged as single-turn
        tolist = getattr(value, "tolist", None)
        if callable(tolist) and not isinstance(value, (list, tuple, dict)):
            try:
                value = tolist()
            except Exception:
                return value
        return value


def iter_rows(rows: Iterable[Any]) -> Iterator[Any]:
    """Rows of a list/iterable of mappings, or of a pandas DataFrame (as dicts)."""
    to_dict = getattr(rows, "to_dict", None)
    if callable(to_dict) and hasattr(rows, "columns"):
        yield from to_dict("records")
        return
    yield from rows


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


def _format_of(path: Path, explicit: Optional[str] = None) -> str:
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
    kind = _format_of(path, fmt or ("jsonl" if stdin else None))
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
        if _format_of(path, fmt) != "parquet":
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


def _new_file_mode(target: Path) -> int:
    """Permission bits for a file replacing ``target``: the old file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


class AtomicFile:
    """A file written under a temporary name in its directory and renamed over ``path`` by
    :meth:`commit`, so ``path`` never holds a half-written file: it keeps its old content
    until the rename. A symlink ``path`` stays a link (its target is replaced); a path that
    exists and is not a regular file (``/dev/null``, a FIFO) is written directly.

    ``handle`` is the open binary file. Raises ``OSError`` when the directory cannot be
    created or written."""

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)
        try:
            self.direct = not stat.S_ISREG(os.stat(self.path).st_mode)  # /dev/stdout: a pipe
        except FileNotFoundError:  # a new file, or a symlink to one
            self.direct = False
        if self.direct:
            self.target = self.temp = self.path
            self.handle = open(self.path, "wb", buffering=0)
            return
        target = Path(os.path.realpath(self.path))
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.fchmod(fd, _new_file_mode(target))
        self.target, self.temp = target, Path(name)
        self.handle = open(fd, "wb", buffering=0)

    def commit(self) -> None:
        """Close the file and rename it over the target."""
        self.handle.close()
        if not self.direct:
            os.replace(self.temp, self.target)

    def discard(self) -> None:
        """Close and delete the temporary file; the target is left as it was."""
        self.handle.close()
        if not self.direct:
            self.temp.unlink(missing_ok=True)


def write_atomically(path: Union[str, Path], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :class:`AtomicFile`: an interruption or a
    write error leaves the old file (or none), never a truncated one."""
    out = AtomicFile(path)
    try:
        _write_all(out.handle, text.encode("utf-8"))
    except BaseException:
        out.discard()
        raise
    out.commit()


def _write_all(handle: Any, data: bytes) -> None:
    """Write every byte of ``data`` to an unbuffered binary file (``write`` may be partial)."""
    view = memoryview(data)
    while view:
        view = view[handle.write(view) :]


def _as_text(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str) if isinstance(value, (dict, list, tuple)) else str(value)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _parquet_writable(kind: Any) -> bool:
    """Whether Parquet can store an Arrow type: Arrow types values like ``{}`` as a struct of no
    fields, which Parquet has no schema for (pyarrow raises at write time)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return kind.num_fields > 0 and all(_parquet_writable(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _parquet_writable(kind.value_type)
    if pa.types.is_map(kind):
        return _parquet_writable(kind.key_type) and _parquet_writable(kind.item_type)
    return True


def arrow_table(rows: list[dict]) -> tuple[Any, list[str]]:
    """A pyarrow Table of ``rows`` (columns: the union of their keys, in first-seen order;
    missing values are null) and the names of the columns Arrow could not type (mixed int and
    str, lists of mixed items, ...), which are written as strings (lists and dicts as JSON)."""
    import pyarrow as pa

    names = list(dict.fromkeys(key for row in rows for key in row))
    columns, stringified = [], []
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            column = pa.array(values)
            if not _parquet_writable(column.type):
                raise TypeError(f"Parquet cannot store {column.type}")
            columns.append(column)
        except Exception:  # ArrowInvalid, ArrowTypeError, OverflowError, UnicodeEncodeError, ...
            columns.append(pa.array([_as_text(v) for v in values], type=pa.string()))
            stringified.append(name)
    return pa.Table.from_arrays(columns, names=names), stringified


#: Rows of a CSV or Parquet output converted at a time when it is written (see :class:`RowWriter`).
WRITE_BATCH_ROWS = 1024


class RowWriter:
    """Writes output rows to JSONL (streamed, one line written per row), or CSV or Parquet
    (written at :meth:`close`, so columns are the union over all rows: until then the rows
    wait in an unlinked temporary file beside the output, so memory does not grow with them;
    the file is read twice at close, :data:`WRITE_BATCH_ROWS` rows at a time).

    Everything goes to a temporary file in the output's directory (:class:`AtomicFile`),
    renamed over ``path`` by :meth:`close`: until then ``path`` keeps its old content.

    Parquet columns: a column's type is Arrow's for its values, promoted across batches as
    ``pyarrow.unify_schemas(promote_options="permissive")`` does (int and float: float); values
    Arrow cannot type together (ints and strings) make the column strings (lists and dicts as
    JSON), named in :attr:`stringified`.

    Errors: the constructor raises ``OSError`` when the output directory cannot be written.
    :meth:`write` raises ``OSError`` when the disk refuses a row (JSONL: the file is cut back
    to the rows written whole, and :meth:`close` still renames it). :meth:`close` raises when
    the CSV/Parquet file cannot be written; ``path`` then keeps its old content and
    :meth:`pending_rows` gives the rows back.

    Attributes:
        written: rows in the output file so far (JSONL), or after a successful close.
        pending: rows accepted but not in the output file (CSV/Parquet until closed).
        stringified: Parquet columns of mixed types written as strings.
    """

    def __init__(self, path: Union[str, Path], fmt: Optional[str] = None):
        self.path = Path(path)
        self.kind = _format_of(self.path, fmt)
        self.pending = 0
        self.written = 0
        self.stringified: list[str] = []
        if self.kind == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError as exc:
                raise ImportError("Parquet needs pyarrow: pip install 'relevancy-tracer[pandas]'") from exc
        self._out = AtomicFile(self.path)
        self._size = 0
        self._spill: Optional[BinaryIO] = None

    def write(self, row: dict) -> None:
        if self.kind != "jsonl":
            self._hold(row)
            return
        # lone surrogates (read_rows refuses them; a caller's own rows may hold them) are
        # written as the JSON escapes they came from
        line = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode("utf-8", "backslashreplace")
        try:
            _write_all(self._out.handle, line)
        except OSError:
            if not self._out.direct:
                os.ftruncate(self._out.handle.fileno(), self._size)  # no half line
            raise
        self._size += len(line)
        self.written += 1

    def _hold(self, row: dict) -> None:
        import pickle

        if self._spill is None:
            folder = None if self._out.direct else self._out.target.parent
            # unbuffered: a refused write (disk full, file too large) fails here, on this row
            self._spill = tempfile.TemporaryFile(dir=folder, prefix=".relevancy-rows.", buffering=0)
        try:
            data = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a value pickle refuses: kept as its JSON text, as JSONL would
            data = pickle.dumps(json.loads(json.dumps(row, default=str)), protocol=pickle.HIGHEST_PROTOCOL)
        end = self._spill.seek(0, os.SEEK_END)
        try:
            _write_all(self._spill, data)
        except OSError:
            os.ftruncate(self._spill.fileno(), end)  # no half row
            raise
        self.pending += 1

    def pending_rows(self) -> Iterator[dict]:
        """The rows accepted and not in the output file, in order (CSV/Parquet), read back one
        at a time."""
        import pickle

        if self._spill is None:
            return
        with open(os.dup(self._spill.fileno()), "rb") as reader:  # buffered, same file
            reader.seek(0)
            for _ in range(self.pending):
                yield pickle.load(reader)

    def _batches(self, transform: Callable[[dict], dict]) -> Iterator[list[dict]]:
        batch: list[dict] = []
        for row in self.pending_rows():
            batch.append(transform(row))
            if len(batch) >= WRITE_BATCH_ROWS:
                yield batch
                batch = []
        if batch:
            yield batch

    def discard(self) -> None:
        """Delete what was written: ``path`` is left as it was (nothing to write)."""
        self._out.discard()
        self._drop_spill()
        self.pending = 0

    def _drop_spill(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def close(self) -> None:
        if self.kind == "jsonl":
            self._out.commit()
            return
        try:
            if self.kind == "csv":
                self._write_csv()
            else:
                self._write_parquet()
        except BaseException:
            self._out.discard()
            raise
        self._out.commit()
        self.written, self.pending = self.pending, 0
        self._drop_spill()

    def _write_csv(self) -> None:
        def flat(row: dict) -> dict:  # nested values become JSON text in flat formats
            return {k: (json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, (dict, list)) else v) for k, v in row.items()}

        fields: dict[str, None] = {}
        for batch in self._batches(flat):
            for row in batch:
                fields.update(dict.fromkeys(row))
        with io.TextIOWrapper(io.BufferedWriter(self._out.handle), encoding="utf-8", errors="backslashreplace", newline="") as text:
            writer = csv.DictWriter(text, fieldnames=list(fields))
            writer.writeheader()
            for batch in self._batches(flat):
                writer.writerows(batch)

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        def dicts_as_json(row: dict) -> dict:
            return {k: (json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, dict) else v) for k, v in row.items()}

        names: dict[str, None] = {}
        types: dict[str, Any] = {}
        stringified: dict[str, None] = {}
        for batch in self._batches(dicts_as_json):  # first pass: the columns and their types
            table, mixed = arrow_table(batch)
            names.update(dict.fromkeys(table.column_names))
            stringified.update(dict.fromkeys(mixed))
            for field in table.schema:
                if field.name in stringified:
                    continue
                before = types.get(field.name)
                if before is None or pa.types.is_null(before):
                    types[field.name] = field.type
                elif not pa.types.is_null(field.type) and field.type != before:
                    try:
                        unified = pa.unify_schemas([pa.schema([pa.field("c", before)]), pa.schema([pa.field("c", field.type)])], promote_options="permissive").field("c").type
                        if not _parquet_writable(unified):
                            raise TypeError(f"Parquet cannot store {unified}")
                        types[field.name] = unified
                    except Exception:  # ArrowTypeError, ArrowInvalid: not one type
                        stringified[field.name] = None
        self.stringified = [name for name in names if name in stringified]
        schema = pa.schema([pa.field(name, pa.string() if name in stringified else types.get(name, pa.null())) for name in names])
        with io.BufferedWriter(self._out.handle) as buffered, pq.ParquetWriter(buffered, schema) as writer:
            for batch in self._batches(dicts_as_json):  # second pass: the rows, typed as decided
                columns = []
                for field in schema:
                    values = [row.get(field.name) for row in batch]
                    if field.name in stringified:
                        columns.append(pa.array([_as_text(v) for v in values], type=pa.string()))
                    else:
                        columns.append(pa.array(values, type=field.type))
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
