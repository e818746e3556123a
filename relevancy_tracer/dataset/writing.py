"""Batch file output: rows written to JSONL, CSV or Parquet (:class:`RowWriter`), and every
file written atomically, under a temporary name renamed over the target (:class:`AtomicFile`,
:func:`write_atomically`), so an interruption never leaves a truncated file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

from .reading import format_of


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
        self.kind = format_of(self.path, fmt)
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
