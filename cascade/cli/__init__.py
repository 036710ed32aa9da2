"""The `cascade` command line (typer): on top of every other package."""
