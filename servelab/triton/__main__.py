"""``python -m servelab.triton ACTION ...`` (same as ``python -m servelab triton ACTION``)."""

from servelab.triton.cli import main

raise SystemExit(main())
