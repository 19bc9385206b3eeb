"""The local stack: every service as a plain process on loopback (`servelab up` / `down`),
with Triton supervised."""
