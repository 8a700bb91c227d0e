"""What the embedded server tells the people who operate it: `metrics`, the Prometheus metrics
served at GET /metrics (`sieverag:*`, in vLLM's naming style), one registry per app."""
