"""The filtering proxy (`sieverag serve --proxy-to URL`): `router` its chat route,
`chat_proxy` the work (`ChatProxy`: filter a request's marked documents, forward the rest),
`marked_documents` how a request marks them and the body forwarded, `upstream` the client of
the server it forwards to."""
