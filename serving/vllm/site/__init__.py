"""Put on vLLM's PYTHONPATH by the launcher: its `sitecustomize` mends vLLM's CPU build at start."""
