"""Command implementations behind the CLI (kept out of cli.py so it stays thin)."""
