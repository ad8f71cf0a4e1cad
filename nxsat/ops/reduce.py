"""Operators: reduce (being written)."""
