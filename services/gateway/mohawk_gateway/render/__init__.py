"""Token events to OpenAI response bodies and stream chunks, one module per endpoint."""
