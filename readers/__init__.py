"""Serving the canonical store at training time (see DESIGN.md)."""
