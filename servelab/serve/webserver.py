"""How the Flask container serves the public web page (gunicorn settings).

The Flask image runs::

    gunicorn --config python:servelab.serve.webserver servelab.serve.harden:flask_app

This module *is* that config file (gunicorn reads its lower-case settings)
plus the worker class it names. The page is published on the node's public
port 80, so strangers' clients must not be able to take every worker:

* **an event loop per worker, not a thread per connection** (gevent): a
  client that sends its request a byte at a time costs one greenlet (a few
  KB), not one of a handful of threads; ``worker_connections`` greenlets per
  worker;
* **a deadline for the request headers**: a connection that has not sent
  complete headers ``HEADER_TIMEOUT_S`` after it opened (or after its previous
  request, on keep-alive) is closed -- gunicorn's async workers apply
  ``keepalive`` as that deadline;
* **an idle timeout on the socket** (``IDLE_TIMEOUT_S``): a client that stops
  sending its body, or stops reading the answer, is dropped;
* **repeated framing headers refused**: a second ``Content-Type``,
  ``Content-Length`` or ``Transfer-Encoding`` is a 400 before the body is
  read (``servelab.serve.serving_contract.repeated_framing_headers``, the rule the
  FastAPI services follow too);
* **a deadline for the whole request** (``REQUEST_TIMEOUT_S``): a body that
  trickles in below the idle timeout still ends; it is above the backend
  call's own timeout (30 s), so a slow model answer is not cut short.

The page checks only an upload's header (the model server decodes it), except
with INFERENCE_BACKEND=triton_onnx, where it decodes the photo itself: a greenlet
that decodes holds its worker for that time (tens of milliseconds), and since
greenlets run one at a time, a worker decodes one upload at once, which also
bounds the memory decoding takes.

Run it without Docker (what tests/services/test_flask_app.py does)::

    HOST=127.0.0.1 PORT=5000 gunicorn --config python:servelab.serve.webserver servelab.serve.harden:flask_app
"""

from __future__ import annotations

import os

HEADER_TIMEOUT_S = 5
IDLE_TIMEOUT_S = 10
REQUEST_TIMEOUT_S = 60

# --- gunicorn settings (names gunicorn reads from this module) -------------
bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '5000')}"
workers = int(os.environ.get("WEB_WORKERS", "2"))
worker_class = "servelab.serve.webserver.SlowClientSafeWorker"
worker_connections = 500          # open connections per worker (each a greenlet)
keepalive = HEADER_TIMEOUT_S      # async workers: the deadline for a request's headers
timeout = 30                      # a worker that stops answering the arbiter is restarted
graceful_timeout = 10
limit_request_line = 4094         # gunicorn's defaults, spelled out: bounded request lines
limit_request_fields = 50         # and header counts (a browser sends ~15)
limit_request_field_size = 8190
accesslog = "-"


def _refuse_repeated_framing(req, sock) -> bool:
    """Answer 400 to a request that repeats Content-Type, Content-Length or
    Transfer-Encoding (gunicorn refuses two Content-Length itself, but hands a
    second Content-Type to the app, which would believe the last one)."""
    from gunicorn import util

    from servelab.serve.serving_contract import repeated_framing_headers, repeated_message

    repeated = repeated_framing_headers(req.headers)
    if not repeated:
        return False
    util.write_error(sock, 400, "Bad Request", repeated_message(repeated))
    return True


def _worker_base():
    from gunicorn.workers.ggevent import GeventWorker

    return GeventWorker


class SlowClientSafeWorker(_worker_base()):
    """gunicorn's gevent worker with a socket idle timeout and a whole-request
    deadline (the header deadline is gunicorn's own ``keepalive`` timer)."""

    def handle(self, listener, client, addr):
        from gunicorn.workers.base_async import AsyncWorker

        # GeventWorker.handle would make the socket fully blocking (no timeout).
        client.setblocking(1)
        client.settimeout(IDLE_TIMEOUT_S)
        AsyncWorker.handle(self, listener, client, addr)

    def handle_request(self, listener_name, req, sock, addr):
        import gevent

        if _refuse_repeated_framing(req, sock):
            raise StopIteration()   # answered 400 before the body is read; connection closed

        timer = gevent.Timeout(REQUEST_TIMEOUT_S)
        timer.start()
        try:
            return super().handle_request(listener_name, req, sock, addr)
        except gevent.Timeout as err:
            if err is not timer:
                raise
            self.log.warning("request from %s took over %d s: connection closed", addr, REQUEST_TIMEOUT_S)
            raise StopIteration() from None
        finally:
            timer.close()
