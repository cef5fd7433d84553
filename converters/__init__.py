"""Moving whole datasets between formats (see DESIGN.md)."""
