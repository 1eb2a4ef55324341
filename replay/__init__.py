"""Replay a prompt corpus against an OpenAI-compatible server and measure what users feel.

This package knows nothing of `planner`: it takes a URL and a corpus and returns results.
Its packages are the stages of the flow, in order (ARCHITECTURE.md draws it; each package's
docstring says its one job and what it hands on):

    corpus/  what to send              -> load/    when to send
    client/  one streamed request      -> prefix/  the corpus in tokens and KV blocks
    server/  what vLLM says             -> slo/     verdicts on figures
    step/    one load, one window       -> search/  the next concurrency, the answer
    run/     a whole replay, saved as it goes

stats/ holds the statistics every stage uses; errors, atomic, records, identity and results
(the results schema) are shared by all. An import never runs against the flow
(tests/unit/test_stages.py).
"""
