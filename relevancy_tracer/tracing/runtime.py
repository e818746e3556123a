"""The process runtime: one object owning the tracer's state, in the style of sentry-python's
``Client``.

A :class:`Runtime` owns, for one configuration: the settings, the scoring engine (its model
clients and caches), the job queue (its dispatcher runs on the process's one background loop,
:func:`relevancy_tracer._background.loop.process_loop`) with its admission by capacity
(:class:`~relevancy_tracer._background.capacity.Capacity`: sampled calls the scorer cannot
finish in time end at once with status ``capacity``), the samplers (the rate limiter's token
bucket), the metrics, the drift monitor, and the OpenTelemetry providers this library installed.
:mod:`.lifecycle` holds the process's current runtime (its only singleton state) and replaces
it on ``configure()``.

Fork: the runtime registers itself with the package's one ``os.register_at_fork`` hook
(:mod:`relevancy_tracer._background.fork`); in a child its job queue is emptied and its samplers rebuilt, while the loop, the
model clients, the local models' locks and the caches' locks are renewed by their own modules'
registrations. A child's first traced call starts the child's own loop thread.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from opentelemetry import trace

from .._background import fork as _fork
from .._background.loop import process_loop
from ..config import Settings
from ..otel.metrics import shared_metrics
from ..otel.setup import OwnedProviders, bounded, service_name
from .sampling import build_sampler
from .._version import __version__
from ..scoring.engine import Engine
from .._background.capacity import Capacity
from .._background.jobqueue import GRACE, JobQueue

logger = logging.getLogger("relevancy_tracer")


class Runtime:
    """Settings, engine, job queue, samplers, metrics and providers of the process's tracer.

    Args:
        settings: resolved settings. engine: scoring engine (default: one for ``settings``).
        owned: providers this library installed; flushed and shut down with the runtime.

    Attributes:
        active: False once :meth:`shutdown` ran (the decorator then calls functions untraced).
    """

    def __init__(self, settings: Settings, engine: Optional[Engine] = None, owned: Optional[OwnedProviders] = None):
        self.settings = settings
        self.engine = engine or Engine(settings)
        self.loop = process_loop()
        # admission by capacity: a call is queued only when its result can be written in time
        # (by the end of the answer span's hold, or within evaluation_timeout on an evaluation span)
        budget = settings.hold_timeout if settings.attach == "answer_span" else settings.evaluation_timeout
        self.capacity = Capacity(settings.concurrency, budget, base_ratio=settings.sample_ratio)
        self.jobs = JobQueue(queue_size=settings.queue_size, concurrency=settings.concurrency, loop=self.loop, capacity=self.capacity)
        self.sampler = build_sampler(settings.sample_ratio, settings.rate_limit, settings.sampler)
        self.otel_tracer = trace.get_tracer("relevancy_tracer", __version__)
        self.owned = owned or OwnedProviders()
        self.service_name = service_name()
        self.metrics = shared_metrics(self.service_name, self._depth)
        self.metrics.admission = self.capacity
        self.drift = None
        if settings.drift_detection:
            try:
                from .drift import DriftMonitor

                self.drift = DriftMonitor(service_name=self.service_name)
            except Exception:  # the monitor is optional; the tracer works without it
                logger.exception("relevancy-tracer: drift detector disabled")
        self.annotations = None
        if settings.phoenix_url:
            try:
                from ..phoenix_annotations import PhoenixAnnotationSink

                self.annotations = PhoenixAnnotationSink(settings.phoenix_url)
            except Exception as exc:  # e.g. httpx missing: annotations are optional, tracing is not
                logger.warning("relevancy-tracer: Phoenix annotations disabled (phoenix_url set): %s", exc)
        self.active = True
        _fork.renew_after_fork(self, Runtime._renew_after_fork)

    def _renew_after_fork(self) -> None:
        self.jobs.reset_after_fork()
        # a child measures its own share of the model host from scratch
        self.capacity = self.jobs.capacity = Capacity(self.capacity.concurrency, self.capacity.budget, base_ratio=self.capacity.base_ratio)
        self.metrics.admission = self.capacity
        self.sampler = build_sampler(self.settings.sample_ratio, self.settings.rate_limit, self.settings.sampler)

    def _depth(self) -> int:
        return self.jobs.depth

    @property
    def enabled(self) -> bool:
        """True when calls are traced: the master switch is on and the runtime not shut down."""
        return self.active and self.settings.enabled

    def redact(self, question: Optional[str], answer: Optional[str], contexts: Optional[list[str]]) -> tuple:
        """The texts through the ``redact`` hook (raises what the hook raises)."""
        redact = self.settings.redact
        if redact is None:
            return question, answer, contexts
        return (
            redact(question, "question") if question is not None else None,
            redact(answer, "answer") if answer is not None else None,
            [redact(c, "context") for c in contexts] if contexts is not None else None,
        )

    def redact_history(self, past: Any) -> Any:
        """A :class:`~relevancy_tracer.scoring.conversation.History` with each turn's text
        through the ``redact`` hook (field ``history``); raises what the hook raises."""
        redact = self.settings.redact
        if redact is None or not past:
            return past
        import dataclasses

        from ..scoring.conversation import Turn

        return dataclasses.replace(past, turns=tuple(Turn(t.role, redact(t.content, "history")) for t in past.turns))

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for pending evaluations, then force-flush the providers; True when all of it
        finished. Returns within ``timeout`` plus a fraction of a second."""
        deadline = time.monotonic() + max(0.0, timeout)
        ok = self.jobs.flush(timeout)
        if self.annotations is not None:
            ok = self.annotations.flush(max(0.0, deadline - time.monotonic())) and ok
        providers = [trace.get_tracer_provider(), _meter_provider()]
        for provider in providers:
            force_flush = getattr(provider, "force_flush", None)
            if not callable(force_flush):
                continue
            remaining = max(0.0, deadline - time.monotonic())
            outcome: list[Any] = []
            finished = bounded(lambda: outcome.append(force_flush(int(remaining * 1000))), remaining + GRACE / 2)
            ok = ok and finished and outcome[:1] != [False]
        return ok

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Finish or cancel pending evaluations (ending every held span), then shut down the
        providers this library installed. Final: the runtime traces nothing afterwards. Returns
        within ``timeout`` plus about a second, whatever the model and OTLP endpoints do."""
        deadline = time.monotonic() + max(0.0, timeout)
        # the spans the cancellation ends (status shutdown) still have to be exported: the flush
        # leaves part of the timeout to the exporters, or a process exiting right after this
        # returns (a web server after its lifespan) would lose them
        export = min(EXPORT_RESERVE, max(0.0, timeout) / 4)
        self.active = False
        ok = self.jobs.shutdown(max(0.0, timeout - export))
        if self.annotations is not None:
            ok = self.annotations.shutdown(max(0.0, deadline - time.monotonic())) and ok
        if self.owned.tracer_provider is not None or self.owned.meter_provider is not None:
            ok = self.owned.shutdown(max(export, deadline - time.monotonic())) and ok
        return ok


#: Seconds of :meth:`Runtime.shutdown`'s timeout kept for the exporters (at most a quarter of it).
EXPORT_RESERVE = 2.0


def _meter_provider() -> Any:
    from opentelemetry import metrics

    return metrics.get_meter_provider()
