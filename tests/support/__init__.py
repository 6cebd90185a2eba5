"""Test-only stand-ins (an OpenAI-compatible fake server, a fake vLLM host process)."""
