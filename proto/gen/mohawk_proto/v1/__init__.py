"""Generated from proto/mohawk/v1 by make proto."""
