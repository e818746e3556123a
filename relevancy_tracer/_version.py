"""The package version, the one place it is written: ``pyproject.toml`` reads it from here
(``[tool.setuptools.dynamic]``, statically, without importing the package). Importable without
importing the package: the tracer and the service name their OpenTelemetry instrumentation scope with it."""

__version__ = "0.1.0"
