"""The one base exception of Mohawk's libraries, and the few kinds callers tell apart."""


class MohawkError(Exception):
    """Base of every error Mohawk raises on purpose; its message is fit to show a user."""


class ConfigError(MohawkError):
    """A setting, flag or config file holds a value Mohawk cannot use."""


class ModelLoadError(MohawkError):
    """A model path is missing, unreadable, or holds an architecture Mohawk does not support."""


class InvalidRequestError(MohawkError):
    """A request (prompt, sampling values) cannot be served as asked."""
