"""Replay a prompt corpus against an OpenAI-compatible server and measure what users feel.

This package knows nothing of `planner`: it takes a URL and a corpus and returns results.
The pipeline follows the folders' data flow: corpus -> load pattern -> client -> step -> search.
"""
