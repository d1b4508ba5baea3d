"""``python -m mxperf``: the same command line as ``mxperf``."""

from mxperf.cli import main

raise SystemExit(main())
