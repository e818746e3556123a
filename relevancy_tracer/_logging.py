"""Logging a failure without leaking user text.

An exception message may quote the user's question, the app's answer or a model's reply. With
content capture off (``capture_content=False``), failures are logged with the exception's type
and its stack (file, line and source of each frame: code, not data), never its message.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Optional

logger = logging.getLogger("relevancy_tracer")


def log_failure(message: str, capture_content: bool, exc: Optional[BaseException] = None) -> None:
    """Log ``message`` at ERROR with the current (or given) exception: in full when content
    capture is on, as its type and stack only when it is off."""
    if exc is None:
        exc = sys.exc_info()[1]
    if exc is None:
        logger.error("relevancy-tracer: %s", message)
        return
    if capture_content:
        logger.error("relevancy-tracer: %s", message, exc_info=(type(exc), exc, exc.__traceback__))
        return
    stack = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("relevancy-tracer: %s: %s (message withheld: capture_content is off)\n%s", message, type(exc).__qualname__, stack)
