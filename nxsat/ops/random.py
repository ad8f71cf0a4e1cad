"""Operators: random (being written)."""
