"""The ``rstitch`` command line: thin subcommands generated from config dataclasses."""
