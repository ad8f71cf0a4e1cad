"""Operators: indexing (being written)."""
