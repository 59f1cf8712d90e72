"""Mohawk's telemetry service: the whole cluster's metrics, and a live dashboard."""
