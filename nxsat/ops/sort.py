"""Operators: sort (being written)."""
