"""OpenTelemetry output of relevancy_tracer: attribute names (``attributes``), spans and events
(``spans``), metrics (``metrics``) and the providers set up from the standard variables
(``setup``)."""
