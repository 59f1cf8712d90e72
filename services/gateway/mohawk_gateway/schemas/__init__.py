"""The HTTP API's bodies: `XCreate` what clients send, `XPublic` what the gateway answers."""
