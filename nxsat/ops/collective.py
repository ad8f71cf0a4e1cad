"""Operators: collective (being written)."""
