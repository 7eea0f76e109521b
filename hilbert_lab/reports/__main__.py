"""`python -m hilbert_lab.reports list|params|run ...`."""
from hilbert_lab.reports.cli import main

raise SystemExit(main())
