"""A fake vLLM-Omni speech server (server.py) for the remote engine's integration tests."""
