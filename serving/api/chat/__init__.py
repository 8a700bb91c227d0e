"""POST /v1/chat/completions: OpenAI's chat completions, log-probs included. `router` holds
the route, `protocol` the request and response bodies, `serving` the work (`Chat`)."""
