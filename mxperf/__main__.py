from mxperf.cli import main

raise SystemExit(main())
