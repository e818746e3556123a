"""The package version (the distribution's, ``pyproject.toml``), importable without importing the
package: the tracer and the service name their OpenTelemetry instrumentation scope with it."""

__version__ = "0.1.0"
