"""Shared pieces of every Mohawk process: settings, logging, errors and the model store."""
