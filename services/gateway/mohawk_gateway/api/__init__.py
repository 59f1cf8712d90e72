"""The HTTP surface: routes per resource, dependencies, error handlers."""
