"""Stage 4, the corpus in tokens and KV blocks: token counts by the server's tokenizer (through the
client) or an estimate, chained block hashes, how much of the corpus shares a prefix (what vLLM's prefix cache
can reuse), and the KV bound that follows: how many requests the pool holds at once. Hands on
figures of the corpus (`planner prompts stats`) and the search's ceiling (the sweep, the estimate)."""
