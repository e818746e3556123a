"""Reading a file of rows and scoring them concurrently, for ``score`` and ``calibrate``."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Callable, Optional

from ..dataset import STDIN, ColumnMapping, InputRow, read_rows, same_file
from ..result import RelevancyResult, Status
from ..scoring.engine import Engine
from .._signals import StopSignals

#: Longest a signal waits for the main thread while the input is read: the read runs on a
#: thread of its own, and the main thread waits for it in slices of this many seconds.
SIGNAL_LATENCY = 0.25


async def score_rows(engine: Engine, rows: list[InputRow], mapping: ColumnMapping, concurrency: int, on_done: Callable[[int, RelevancyResult], None]) -> None:
    """Score ``rows`` with ``engine``, at most ``concurrency`` at once, calling
    ``on_done(index, result)`` as each finishes (in completion order). A row that could not be
    read or lacks a column gets status ``invalid_input``; nothing raises for bad rows."""
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int, row: InputRow) -> None:
        if row.error is not None:
            result = RelevancyResult.failure(Status.INVALID_INPUT, row.error, method=engine.settings.method)
        else:
            async with limit:
                try:
                    question, answer, contexts = mapping.extract(row.data)
                except Exception as exc:
                    result = RelevancyResult.failure(Status.INVALID_INPUT, f"line {row.line}: missing column {exc}", method=engine.settings.method)
                else:
                    result = await engine.ascore(question, answer, contexts)
        on_done(index, result)

    await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))


def refuse_same_file(input_path: str, output: Optional[str]) -> None:
    """ValueError when ``output`` is the input file (same path, symlink or hard link; for ``-``,
    the file standard input was redirected from)."""
    source = "/dev/stdin" if input_path == STDIN else input_path
    if output and same_file(source, output):
        raise ValueError(f"-o {output} is the input file {input_path}; write the output to another file")


def read_input(input_path: str, input_format: Optional[str], limit: Optional[int], signals: StopSignals) -> Optional[list[InputRow]]:
    """The rows of ``input_path`` (at most ``limit``; ``-``: standard input), or None when
    SIGINT or SIGTERM came while reading; raises what :func:`~relevancy_tracer.dataset.read_rows`
    raises.

    The input is read on a daemon thread while the main thread waits for it in slices of
    :data:`SIGNAL_LATENCY` seconds: a read (or the open of a FIFO) blocked on a silent writer
    cannot hold off a signal, whichever thread of the process the kernel delivered it to (a
    signal interrupts a blocked system call only in the thread that received it, and the
    native threads of numpy's BLAS can be that thread)."""
    rows: list[InputRow] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            for row in read_rows(input_path, input_format):
                if done.is_set() or (limit is not None and len(rows) >= limit):
                    return
                rows.append(row)
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)
        finally:
            done.set()

    signals.on_stop(done.set)
    threading.Thread(target=read, name="relevancy-tracer-input", daemon=True).start()
    while not done.wait(SIGNAL_LATENCY):
        pass
    signals.on_stop(lambda: None)
    if signals.signum is not None:
        name = "standard input" if input_path == STDIN else input_path
        print(f"relevancy-tracer: interrupted while reading {name}: nothing scored, nothing written", file=sys.stderr)
        return None
    if failures:
        raise failures[0]
    return rows
