"""The mxperf version, at the ground floor so that every output's manifest can record it without the CLI."""

__version__ = "0.2.0"
