"""Stage 5, the server's side of a step: vLLM's /metrics scraped through the step (gauges, counters)
and its histograms at the window's edges, and the cross-check of the client's figures against them.
Hands on a `ServerSummary` and the client-versus-server notes of a step."""
