"""planner: how many concurrent requests each GPU carries under your latency targets."""

__version__ = "0.1.0"
