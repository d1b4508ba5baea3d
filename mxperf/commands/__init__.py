"""The ``mxperf`` subcommands: one thin module per command (parse, validate, call the library, print)."""
