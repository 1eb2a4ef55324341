"""Stage 8, the search: the highest concurrency that passes every SLO. A pure policy over the steps
so far (`next_probe(history)`), where to start when nothing bounds it (a saturation probe), how
long it will take (ETA), and the verdicts read from finished steps (knee, binding constraint, and
the knee read from every step as a pass probability: pass_fit). Hands the next concurrency to the
runner, and the answer to the results."""
