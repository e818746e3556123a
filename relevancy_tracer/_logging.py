"""Logging without leaking user text or credentials.

An exception message may quote the user's question, the app's answer or a model's reply. With
content capture off (``capture_content=False``), failures are logged with the exception's type
and its stack (file, line and source of each frame: code, not data), never its message.

A URL may carry credentials (``http://user:pass@host/v1``, ``redis://:pass@host:6379/0``,
``?api_key=...``): :func:`mask_credentials` masks them, and :class:`CredentialsFilter`, set on
this package's loggers (and by the CLI on its log handlers, which also see the HTTP clients'
request lines), applies it to every log line and traceback.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from typing import Any, Optional

logger = logging.getLogger("relevancy_tracer")

#: ``scheme://userinfo@``: the userinfo (user, password, token) is masked.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@?#'\"<>]+@")
#: Query parameters that carry secrets.
_SECRET_PARAMS = re.compile(r"(?P<name>[?&](?:api[_-]?key|key|token|access_token|password|secret|sig|signature)=)[^&#\s'\"<>]+", re.IGNORECASE)
MASK = "***"


def mask_credentials(text: Any) -> str:
    """``text`` (any object, as ``str``) with the credentials of every URL in it masked: the
    userinfo (``http://user:pass@host`` -> ``http://***@host``) and the values of secret query
    parameters (``api_key``, ``key``, ``token``, ``access_token``, ``password``, ``secret``,
    ``sig``, ``signature``). Use it wherever a base URL or endpoint is logged or printed."""
    masked = _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", str(text))
    return _SECRET_PARAMS.sub(lambda m: m.group("name") + MASK, masked)


class CredentialsFilter(logging.Filter):
    """A logging filter masking URL credentials (:func:`mask_credentials`) in a record's
    message and traceback; records without credentials pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: the handler reports it
            return True
        masked = mask_credentials(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            masked = mask_credentials(text)
            if masked != text:
                record.exc_text = masked
        return True


_FILTER = CredentialsFilter()


def mask_credentials_in(target: Any) -> None:
    """Add the credentials filter to a logger or handler (once)."""
    if _FILTER not in target.filters:
        target.addFilter(_FILTER)


for _name in ("relevancy_tracer", "relevancy_tracer.drift"):
    mask_credentials_in(logging.getLogger(_name))


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
