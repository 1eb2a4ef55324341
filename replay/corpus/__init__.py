"""Stage 1, the corpus: what to send. Reads the corpus JSONL (one request, or one conversation,
a line; replay.corpus.jsonl) and converts other formats into it (ShareGPT, a chat log, a Mooncake
trace). Hands on a `Corpus`: its requests or sessions, each line's place in the file, its hash."""
