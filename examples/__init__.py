"""Examples of relevancy-tracer (installed as ``relevancy_tracer._examples``)."""
