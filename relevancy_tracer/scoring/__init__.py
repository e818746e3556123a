"""Answer-relevancy scoring: the engine, the methods, prompts and reply parsing."""

from .engine import Engine, prepare_inputs, run_sync
from .methods import METHODS, MethodOutput, apply_noncommittal

__all__ = ["Engine", "prepare_inputs", "run_sync", "METHODS", "MethodOutput", "apply_noncommittal"]
