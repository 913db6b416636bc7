"""`python -m runners.report DIR`: the same command as `splitbench-report DIR`."""
from runners.report import main

raise SystemExit(main())
