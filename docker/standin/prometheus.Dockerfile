# Stand-in for prom/prometheus:v2.42.0 (docker/standin/README.md). Built by the compose check.
FROM servelab-standin/bookworm:base
LABEL org.servelab.standin="prom/prometheus:v2.42.0 stand-in: Debian 12 prometheus 2.42 and wget"
RUN mkdir -p /prometheus /etc/prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
# The official image's entrypoint and default flags.
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
