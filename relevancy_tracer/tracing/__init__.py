"""Tracing: the ``@trace`` decorator and everything that happens per traced call.

:mod:`.decorator` wraps the app's callable; :mod:`.call` runs one call's span, sampling
(:mod:`.sampling`), extraction (:mod:`.extraction`) and hand-off; :mod:`.job` scores it in the
background and writes the result; :mod:`.drift` watches the scores; :mod:`.runtime` holds one
configuration's objects and :mod:`.lifecycle` the process's (``configure``, ``flush``,
``shutdown``). The public names are re-exported by :mod:`relevancy_tracer`.
"""
