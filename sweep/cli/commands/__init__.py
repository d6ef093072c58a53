"""Subcommands of the `sweep` command line; each module exposes `register(subparsers)`."""
