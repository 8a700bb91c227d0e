"""The embedded server's ASGI middleware, each checking every request before any route runs:
`auth` (the bearer key), `body_limit` (the body's size), `disconnect` (a client that goes
away cancels its request), `concurrency` (at most --local.max-concurrent-requests at once,
none while draining), `request_metrics` (every request counted in the server's metrics)."""
