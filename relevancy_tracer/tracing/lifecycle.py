"""The lifecycle: ``configure()``, ``flush()``, ``shutdown()``, interpreter exit; and the
process's state: the current settings, the default engine and the tracer's
:class:`~relevancy_tracer.tracing.runtime.Runtime` (the package's only singletons).

* ``configure(**settings)`` builds the process's :class:`~relevancy_tracer.tracing.runtime.Runtime`
  (replacing an earlier one, whose pending evaluations get up to 5 s) and, with ``setup_otel``,
  installs SDK providers from the ``OTEL_*`` variables where the app has none. It raises only
  for bad *arguments* (a programming error); problems of the environment (a bad
  ``RELEVANCY_TRACER_*`` value, an exporter that cannot start) are warned about once and fall
  back. One INFO line says what was resolved: backends, models, method, calibration, sampling,
  exporters.
* The first traced call without ``configure()`` builds a runtime from the environment (no
  provider setup: it uses the app's providers).
* ``shutdown(timeout)`` is final until ``configure()`` is called again: later traced calls run
  untraced, they never rebuild a runtime on shut-down providers.
* ``flush(timeout)`` and ``shutdown(timeout)`` return within ``timeout`` plus about a second,
  whatever the model and OTLP endpoints do.
* At interpreter exit the runtime is shut down (before ``concurrent.futures`` stops accepting
  work, and before the SDK's own exit hooks, which then export the spans ended here).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Optional

from .._background import fork as _fork
from .._logging import mask_credentials
from ..config import Settings
from ..otel.setup import OwnedProviders, install_providers
from ..scoring.engine import Engine
from .runtime import Runtime

logger = logging.getLogger("relevancy_tracer")

_lock = threading.RLock()
_settings: Optional[Settings] = None  # resolved from the environment on first use, or configure()'s
_engine: Optional[Engine] = None  # the default engine: score(), evaluate() and the tracer's
_current: Optional[Runtime] = None
_shut_down = False  # shutdown() ran and configure() has not been called since
_exit_hook_registered = False


@_fork.after_fork
def _renew_lock() -> None:
    global _lock
    _lock = threading.RLock()


def get_settings() -> Settings:
    """The current settings (resolved from the environment on first call)."""
    global _settings
    if _settings is None:
        with _lock:
            if _settings is None:
                _settings = Settings.resolve()
    return _settings


def get_engine() -> Engine:
    """The default engine (``score()``, ``evaluate()``, the tracer), built from the current
    settings."""
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


def current() -> Optional[Runtime]:
    """The process's runtime: the configured one, else one built from the environment on first
    use; None after ``shutdown()`` until ``configure()`` (calls then run untraced)."""
    runtime = _current
    if runtime is not None or _shut_down:
        return runtime
    with _lock:
        if _current is None and not _shut_down:
            _install(Runtime(get_settings(), engine=get_engine()))
        return _current


def _install(runtime: Runtime) -> None:
    global _current, _exit_hook_registered
    _current = runtime
    if not _exit_hook_registered:
        _register_exit_hook()
        _exit_hook_registered = True


def _register_exit_hook() -> None:
    """Run :func:`shutdown` at interpreter exit, early enough to still finish evaluations.

    ``concurrent.futures`` refuses new work once interpreter shutdown starts, before ordinary
    ``atexit`` handlers run, so pending evaluations (which use worker threads) would fail.
    ``threading._register_atexit`` hooks run before that, and before the OpenTelemetry SDK
    providers' own ``atexit`` shutdown, which then exports the spans ended here.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_shutdown_at_exit)
            return
        except Exception:  # RuntimeError once shutdown has begun
            pass
    atexit.register(_shutdown_at_exit)


def describe(settings: Settings, owned: OwnedProviders) -> str:
    """The start-up line: what was resolved (no secrets, no user text)."""
    llm = settings.resolved_llm_model
    if settings.llm == "local":
        from ..models.local_llm import default_threads

        llm += f", {settings.local_threads or default_threads()} threads"
        llm += ", in the model host" if settings.local_host else ", in process"
    elif settings.llm_base_url:
        llm += f" at {mask_credentials(settings.llm_base_url)}"
    parts = [
        f"llm={settings.llm} ({llm})",
        f"embeddings={settings.embeddings} ({settings.resolved_embedding_model})",
        f"method={settings.method}",
        f"calibration={settings.calibration}",
        f"sample_ratio={settings.sample_ratio:g}",
        f"rate_limit={settings.rate_limit:g}/min" if settings.rate_limit else "rate_limit=none",
        f"attach={settings.attach}",
        f"capture_content={str(settings.capture_content).lower()}",
    ]
    if owned.exporters:
        parts.append("opentelemetry: " + ", ".join(owned.exporters))
    elif not settings.setup_otel:
        parts.append("opentelemetry: the app's providers")
    return "relevancy-tracer: " + "; ".join(parts)


def configure(**settings: Any) -> Settings:
    """Configure the engine and the tracer; returns the resolved settings.

    Every setting is an argument here or a ``RELEVANCY_TRACER_<NAME>`` environment variable
    (see docs/configuration.md). With ``setup_otel`` (default true) and no TracerProvider /
    MeterProvider set by the app, SDK providers with OTLP exporters are installed from the
    standard ``OTEL_*`` variables. Calling it again replaces the tracer: pending evaluations of
    the old one get up to 5 s to finish.

    Raises TypeError / ValueError for an unknown setting or a bad argument value; never for the
    environment (bad values there are logged and fall back).
    """
    global _shut_down
    resolved = Settings.resolve(**settings)
    with _lock:
        previous = _current
        owned = install_providers() if resolved.setup_otel else OwnedProviders()
        if previous is not None:
            # keep providers installed earlier owned by the new runtime
            owned.tracer_provider = owned.tracer_provider or previous.owned.tracer_provider
            if owned.meter_provider is None and previous.owned.meter_provider is not None:
                owned.meter_provider = previous.owned.meter_provider
                owned.listeners = previous.owned.listeners
            previous.owned = OwnedProviders()
        set_settings(resolved)
        _install(Runtime(resolved, engine=get_engine(), owned=owned))
        _shut_down = False
    logger.info(describe(resolved, owned))
    if previous is not None:
        previous.jobs.shutdown(5.0)
        previous.active = False
    return resolved


def flush(timeout: float = 30.0) -> bool:
    """Wait up to ``timeout`` seconds for every pending evaluation to finish and its span to be
    handed to the span processor, then force-flush the providers. True when all of it finished.
    Returns within ``timeout`` plus a fraction of a second."""
    runtime = _current
    return True if runtime is None else runtime.flush(timeout)


def shutdown(timeout: float = 30.0) -> bool:
    """Flush, then cancel what is left (ending every held span with status ``shutdown``), and
    shut down the providers this library installed. Final until :func:`configure` is called
    again. Also runs at interpreter exit. Returns within ``timeout`` plus about a second."""
    global _current, _shut_down
    with _lock:
        runtime = _current
        _current = None
        _shut_down = True
    return True if runtime is None else runtime.shutdown(timeout)


def _shutdown_at_exit() -> None:
    try:
        runtime = _current
        shutdown(timeout=min(10.0, runtime.settings.hold_timeout if runtime else 10.0))
    except Exception:  # pragma: no cover - never fail interpreter exit
        pass
