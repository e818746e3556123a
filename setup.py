"""Package discovery for setuptools (everything else is in pyproject.toml).

Every package under ``relevancy_tracer/`` is found automatically, with or without an
``__init__.py``, so a new subpackage can never be left out of the wheel; ``examples/`` ships as ``relevancy_tracer._examples`` (its import
name is mapped in pyproject.toml's ``package-dir``) so ``relevancy-tracer demo`` runs the same
example RAG app from any installed environment. pyproject.toml cannot express "discovered
packages plus one mapped folder", hence this file.
"""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["relevancy_tracer", "relevancy_tracer.*"], exclude=["*.__pycache__"]), "relevancy_tracer._examples"])
