from servelab.cli import entry

raise SystemExit(entry())
