"""Stage 3, the client: one streamed request, timed. `StreamingClient` sends a corpus request over
its own connection pool (replay.client.transport) and parses the SSE stream (replay.client.sse).
Hands on one `RequestRecord` per request: when it was sent, each token's arrival, its error."""
