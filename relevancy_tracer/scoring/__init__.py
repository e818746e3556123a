"""Answer-relevancy scoring: the engine (:mod:`.engine`), the methods, prompts and reply parsing,
calibration and evaluator identity, and the model backends a configuration asks for
(:mod:`.backends`)."""
