# Stand-in for haproxy:2.6-alpine (docker/standin/README.md). Built by the compose check.
FROM servelab-standin/bookworm:base
LABEL org.servelab.standin="haproxy:2.6-alpine stand-in: Debian 12 haproxy 2.6 and wget"
RUN mkdir -p /usr/local/etc/haproxy
USER haproxy
# The official image's command: master-worker mode, in the foreground, on this config.
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
