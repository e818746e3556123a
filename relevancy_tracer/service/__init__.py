"""The scoring service: score spans of apps that never import this package.

``relevancy-tracer serve`` (:class:`ScoringService`) receives OTLP traces behind a Collector,
selects spans carrying OpenInference or GenAI question/answer attributes and scores them, in
process or through a Redis Stream consumed by ``relevancy-tracer worker`` processes
(:class:`FleetWorker`); ``relevancy-tracer backfill`` (:func:`backfill`) scores spans already in
Phoenix. Results are written as OpenInference EVALUATOR spans, ``gen_ai.evaluation.result`` log
records, metrics and, optionally, Phoenix span annotations.
"""

from .fleet_worker import FleetWorker
from .scoring_service import ScoringService
from .backfill import Backfill, BackfillReport, backfill
from .selection import Selection

__all__ = ["Backfill", "BackfillReport", "FleetWorker", "ScoringService", "Selection", "backfill"]
