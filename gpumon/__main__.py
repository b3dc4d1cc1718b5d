"""`python -m gpumon` runs the command-line interface."""

from gpumon.cli import main

raise SystemExit(main())
