"""Examples of relevancy-tracer, shipped in the package so ``relevancy-tracer demo`` runs the
example RAG app (``rag_app``) from any installed environment, and ``uvicorn
relevancy_tracer._examples.web_service:app`` serves the FastAPI recipe. In the repository,
``examples/`` is a link to this folder. Not an API: the examples use ``relevancy_tracer``'s
public API only."""
