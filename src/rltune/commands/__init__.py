"""Bodies of the CLI commands, one module per command, imported lazily by rltune.cli."""
