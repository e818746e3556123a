"""Process-wide state: the resolved settings and the default engine.

Resolved once, on first use, from the environment; :func:`configure` replaces them. The tracer
(decorator, worker, OpenTelemetry setup) hangs off the same state, see ``tracer.py``.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .config import Settings
from .scoring.engine import Engine

_lock = threading.RLock()
_settings: Optional[Settings] = None
_engine: Optional[Engine] = None


def get_settings() -> Settings:
    """The current settings (resolved from the environment on first call)."""
    global _settings
    if _settings is None:
        with _lock:
            if _settings is None:
                _settings = Settings.resolve()
    return _settings


def get_engine() -> Engine:
    """The default engine, built from the current settings."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                _engine = Engine(get_settings())
    return _engine


def set_settings(settings: Settings) -> None:
    """Install new settings and a new default engine for them."""
    global _settings, _engine
    with _lock:
        _settings = settings
        _engine = Engine(settings)


def reset() -> None:
    """Forget the settings and engine; the next use resolves them from the environment again."""
    global _settings, _engine
    with _lock:
        _settings = None
        _engine = None


def resolve(**overrides: Any) -> Settings:
    """Settings resolved from the environment with ``overrides`` (raises on bad overrides)."""
    return Settings.resolve(**overrides)
