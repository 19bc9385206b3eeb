"""``python3 -m servelab.gpucheck ARGS`` = ``servelab gpu-check ARGS``, importing only this package
(a bare GPU machine's python3 lacks what other subcommands import)."""

from servelab import cli

raise SystemExit(cli.run_alone("servelab.gpucheck", "gpu-check"))
