"""Statistics of samples: percentiles, their confidence intervals, the steady-state rule. Pure
functions of numbers and request records, with no stage of their own in the flow: every stage
from the load on summarizes with them. Hands on `LatencySummary` figures and intervals."""
