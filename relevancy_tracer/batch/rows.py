"""Reading a file of rows and scoring them concurrently: streamed for ``score``
(:class:`RowStream`, :func:`score_stream`), whole for ``calibrate`` (:func:`read_input`,
:func:`score_rows`: a calibration fits on every labelled row at once)."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional

from ..dataset.columns import ColumnMapping
from ..dataset.reading import STDIN, InputRow, read_rows, same_file
from ..result import RelevancyResult, Status
from ..scoring.engine import Engine

#: Longest a signal waits for the main thread while the input is read or scored: the read runs
#: on a thread of its own, and the main thread waits in slices of this many seconds. A read (or
#: the open of a FIFO) blocked on a silent writer cannot hold off a signal, whichever thread of
#: the process the kernel delivered it to (a signal interrupts a blocked system call only in
#: the thread that received it, and the native threads of numpy's BLAS can be that thread; the
#: Python handler runs once the main thread wakes).
SIGNAL_LATENCY = 0.25


async def score_rows(engine: Engine, rows: list[InputRow], mapping: ColumnMapping, concurrency: int, on_done: Callable[[int, RelevancyResult], None]) -> None:
    """Score ``rows`` with ``engine``, at most ``concurrency`` at once, calling
    ``on_done(index, result)`` as each finishes (in completion order). A row that could not be
    read or lacks a column gets status ``invalid_input``; nothing raises for bad rows."""
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int, row: InputRow) -> None:
        if row.error is not None:
            result = await _score_row(engine, mapping, row)
        else:
            async with limit:
                result = await _score_row(engine, mapping, row)
        on_done(index, result)

    await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))


def refuse_same_file(input_path: str, output: Optional[str]) -> None:
    """ValueError when ``output`` is the input file (same path, symlink or hard link; for ``-``,
    the file standard input was redirected from)."""
    source = "/dev/stdin" if input_path == STDIN else input_path
    if output and same_file(source, output):
        raise ValueError(f"-o {output} is the input file {input_path}; write the output to another file")


#: Most bytes of rows read and not yet released (see :class:`RowStream`).
MAX_BYTES_AHEAD = 64 << 20


class RowStream:
    """The rows of an input file, read on a daemon thread at most ``window`` rows (and
    :data:`MAX_BYTES_AHEAD` bytes) ahead of the output: a row is read only once the caller has
    released (:meth:`release`) enough earlier ones, so the rows read and not yet written never
    exceed ``window`` rows, nor 64 MiB plus one row (a JSONL line is at most
    :data:`~relevancy_tracer.dataset.MAX_LINE_BYTES`), whatever the input's size: memory
    O(window), not O(file).

    Args:
        input_path: a file, FIFO or ``-`` (standard input); see
            :func:`~relevancy_tracer.dataset.read_rows`.
        input_format: jsonl | csv | parquet, or None (from the suffix).
        limit: most rows read (None: all).
        window: most rows read and not yet released (>= 1).

    The reading thread is a daemon: a read blocked on a silent writer never holds the process
    open. Attributes: ``read`` (rows read so far), ``error`` (the exception that ended the
    read, or None), ``ended`` (set once the reading thread is done).
    """

    def __init__(self, input_path: str, input_format: Optional[str], limit: Optional[int], window: int):
        self.input_path = input_path
        self.input_format = input_format
        self.limit = limit
        self.window = max(1, int(window))
        self.read = 0
        self.error: Optional[BaseException] = None
        self.ended = threading.Event()
        self._ahead = 0  # rows read and not released
        self._bytes = 0  # their bytes
        self._room = threading.Condition()
        self._stop = threading.Event()

    def start(self, deliver: Callable[[Optional[InputRow]], None]) -> None:
        """Start reading: ``deliver(row)`` is called on the reading thread for each row in file
        order, then ``deliver(None)`` once at the end (the end of the input, an error, the
        limit or :meth:`stop`)."""
        threading.Thread(target=self._run, args=(deliver,), name="relevancy-tracer-input", daemon=True).start()

    def _full(self) -> bool:
        return self._ahead >= self.window or (self._ahead > 0 and self._bytes >= MAX_BYTES_AHEAD)

    def _run(self, deliver: Callable[[Optional[InputRow]], None]) -> None:
        try:
            for row in read_rows(self.input_path, self.input_format):
                if self.limit is not None and self.read >= self.limit:
                    return
                with self._room:
                    while self._full() and not self._stop.is_set():
                        self._room.wait(SIGNAL_LATENCY)
                    if self._stop.is_set():
                        return
                    self._ahead += 1
                    self._bytes += row.size
                self.read += 1
                deliver(row)
        except BaseException as exc:  # handed to the caller
            self.error = exc
        finally:
            self.ended.set()
            try:
                deliver(None)
            except Exception:  # the consumer is gone (its loop stopped): nothing to tell
                pass

    def release(self, row: InputRow) -> None:
        """``row`` (read earlier) is written or dropped: make room for the next."""
        with self._room:
            self._ahead -= 1
            self._bytes -= row.size
            self._room.notify()

    @property
    def full(self) -> bool:
        """Whether the reader waits for a release (the window is taken)."""
        with self._room:
            return self._full()

    def stop(self) -> None:
        """Read no further row (a read blocked inside the file stays blocked, on a daemon thread)."""
        self._stop.set()
        with self._room:
            self._room.notify_all()


async def score_stream(engine: Engine, stream: RowStream, mapping: ColumnMapping, concurrency: int, on_done: Callable[[int, InputRow, RelevancyResult], None]) -> None:
    """Score the rows of ``stream`` as they are read, at most ``concurrency`` at once, calling
    ``on_done(index, row, result)`` as each finishes (in completion order; ``index`` is the
    row's 0-based position in the input). The caller releases each row back to the stream
    once it is done with it. A row that could not be read or lacks a column gets status
    ``invalid_input`` without waiting for a slot. Cancelling stops reading and every
    evaluation in flight."""
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue = asyncio.Queue()  # bounded by the stream's window

    def deliver(row: Optional[InputRow]) -> None:
        loop.call_soon_threadsafe(arrived.put_nowait, row)

    limit = asyncio.Semaphore(concurrency)
    running: set = set()

    async def one(index: int, row: InputRow, slot: bool) -> None:
        try:
            result = await _score_row(engine, mapping, row)
        finally:
            if slot:
                limit.release()
        on_done(index, row, result)

    stream.start(deliver)
    index = 0
    try:
        while True:
            row = await arrived.get()
            if row is None:
                break
            slot = row.error is None
            if slot:
                await limit.acquire()
            task = asyncio.ensure_future(one(index, row, slot))
            running.add(task)
            task.add_done_callback(running.discard)
            index += 1
        if running:
            await asyncio.gather(*list(running))
    finally:
        stream.stop()
        for task in list(running):
            task.cancel()


async def _score_row(engine: Engine, mapping: ColumnMapping, row: InputRow) -> RelevancyResult:
    if row.error is not None:
        return RelevancyResult.failure(Status.INVALID_INPUT, row.error, method=engine.settings.method)
    try:
        question, answer, contexts = mapping.extract(row.data)
        history = mapping.extract_history(row.data)
    except Exception as exc:
        return RelevancyResult.failure(Status.INVALID_INPUT, f"line {row.line}: missing column {exc}", method=engine.settings.method)
    return await engine.ascore(question, answer, contexts, history=history)
