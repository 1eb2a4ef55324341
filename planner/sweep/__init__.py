"""`planner sweep`: launch vLLM across a grid and find the highest safe concurrency per GPU."""
