# Stand-in for python:3.11.13-slim-bookworm (docker/standin/README.md). Built by the compose check.
FROM servelab-standin/bookworm:base
LABEL org.servelab.standin="python:3.11.13-slim-bookworm stand-in: Debian 12 python3 3.11.2 from Debian packages"
# The build host's CA bundle: pip and urllib inside builds and containers trust what the host trusts.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_ROOT_USER_ACTION=ignore
# The official image's commands: python, pip.
RUN ln -s /usr/bin/python3 /usr/local/bin/python && ln -s /usr/bin/pip3 /usr/local/bin/pip
CMD ["python3"]
