"""Operators: norm (being written)."""
