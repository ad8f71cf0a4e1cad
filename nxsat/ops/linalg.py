"""Operators: linalg (being written)."""
