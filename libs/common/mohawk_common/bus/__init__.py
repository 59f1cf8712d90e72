"""What every service shares about the bus: names, connecting, stream and bucket setup, frames."""
