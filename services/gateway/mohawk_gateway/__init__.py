"""OpenAI-compatible HTTP gateway: requests onto the bus, token events back as SSE."""
