"""Statistics of samples: percentiles, their confidence intervals, the steady-state rule,
isotonic regression, and the intervals judged across a point's steps (across_steps). Pure
functions of numbers, request records and step results, with no stage of their own in the flow:
every stage from the load on summarizes with them. Hands on `LatencySummary` figures and
intervals."""
