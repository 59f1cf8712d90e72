"""Mohawk's coordinator: leader election, node registry, placement planning, recovery."""
