"""Files of rows through the engine: ``relevancy-tracer score`` (:func:`~relevancy_tracer.batch.score.score_file`)
and ``relevancy-tracer calibrate`` (:func:`~relevancy_tracer.batch.calibrate.calibrate_file`).

``rows`` holds what both share: the input read so that a signal is never held off, the rows
scored concurrently, and the refusal to write over the input. For rows already in memory,
:func:`relevancy_tracer.evaluate` is the library's form.
"""
