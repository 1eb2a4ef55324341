"""Stage 2, the load: when to send. A load kind (closed-loop concurrency, Poisson rate, trace replay),
the cursor that hands out the corpus, the sessions that replay conversations turn by turn, and one
driver per kind that sends until the step says stop. Hands requests to a sender (the client)."""
