"""Handlers the DJL way: DJL's Input/Output, loading a model's own model.py (a handler or custom
formatters), and the default handlers (text generation, embeddings) run in worker processes."""
