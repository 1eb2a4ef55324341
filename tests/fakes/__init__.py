"""Test doubles that stand in for real servers: fast, deterministic, and runnable in-process."""
