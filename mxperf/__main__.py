"""``python -m mxperf``: the same command line as ``mxperf``."""

from mxperf.cli import entry

if __name__ == "__main__":  # a spawned child process re-imports this module: it must not run the command
    entry()
