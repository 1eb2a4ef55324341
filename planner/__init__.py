"""planner: how many concurrent requests each GPU carries under your latency targets.

Kept free of imports: `python planner/tinymodel.py` runs inside vLLM's own environment.
"""

__version__ = "0.1.0"
