"""The live dashboard: a threading HTTP server that renders the page from the store at each
request (:func:`make_server`), and :func:`listen`, which binds it or says in one line why not
(:class:`ServeError`)."""

from __future__ import annotations

import errno
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mlrc.report.dashboard import Dashboard
from mlrc.report.html import error_page
from mlrc.report.tables import ReportError

__all__ = ["PLOTLY_JS_PATH", "ServeError", "listen", "make_server"]

log = logging.getLogger("mlrc")

PLOTLY_JS_PATH = "/plotly.min.js"


class ServeError(RuntimeError):
    """The server cannot listen where it was asked to (port in use, privileged, bad host)."""


def make_server(
    url: str, host: str = "127.0.0.1", port: int = 8050, refresh: int = 30, archived: bool = False
) -> ThreadingHTTPServer:
    """A threading HTTP server: ``/`` (optionally ``?campaign=C&study=A``, repeatable) renders
    from the store at each request; ``/plotly.min.js`` serves plotly.js (cached by the browser)."""
    from plotly.offline import get_plotlyjs

    handler = type("Handler", (_Handler,), {})
    server = listen(host, port, handler)  # first: a busy port fails before the store is read
    try:
        dash = Dashboard(url)
        dash.page(plotly_js=PLOTLY_JS_PATH)  # fail now on an unusable store; warms the imports
        handler.dash = dash
        handler.plotly_bytes = get_plotlyjs().encode()
        handler.refresh = refresh
        handler.archived = archived
        handler.render_lock = threading.Lock()
    except BaseException:
        server.server_close()
        raise
    return server


class _Handler(BaseHTTPRequestHandler):
    """Serves one request; :func:`make_server` sets the class attributes on a subclass."""

    server_version = "mlrc-dashboard"
    dash: Dashboard
    plotly_bytes: bytes
    refresh: int
    archived: bool = False  # with the archived studies the report leaves out by default
    render_lock: threading.Lock

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        if parts.path == PLOTLY_JS_PATH:
            self._send(200, self.plotly_bytes, "application/javascript", cache=True)
            return
        if parts.path not in ("/", "/index.html"):
            self._send(404, error_page("not found", self.path), "text/html")
            return
        q = parse_qs(parts.query)
        try:
            with self.render_lock:
                text = self.dash.page(
                    q.get("study") or None,
                    q.get("campaign") or None,
                    plotly_js=PLOTLY_JS_PATH,
                    refresh=self.refresh or None,
                    links=True,
                    archived=self.archived,
                )
            self._send(200, text.encode(), "text/html")
        except ReportError as e:  # unknown study or campaign in the query
            self._send(404, error_page("not found", str(e)), "text/html")
        except Exception as e:  # the store went away, a bug: say so, keep serving
            log.exception("dashboard page failed")
            self._send(500, error_page("error", f"{type(e).__name__}: {e}"), "text/html")

    def _send(self, status: int, body: bytes, ctype: str, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading HTTP server bound to ``host:port`` (IPv4 or IPv6); a :class:`ServeError`
    with a one-line reason if it cannot be."""
    if not 0 <= port <= 65535:
        raise ServeError(f"--port {port}: not a port number (0 to 65535)")
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {})
        server_class.address_family = socket.AF_INET6
    try:
        return server_class((host, port), handler)
    except socket.gaierror as e:
        raise ServeError(f"--host {host}: cannot resolve this address ({e.strerror})") from None
    except OSError as e:
        raise ServeError(_listen_error(host, port, e)) from None


def _listen_error(host: str, port: int, e: OSError) -> str:
    """Why ``host:port`` cannot be bound, in one line with what to do."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    reason = e.strerror or str(e)
    if e.errno == errno.EADDRINUSE:
        return f"{where} is already in use; choose another --port"
    if e.errno == errno.EACCES:
        below = " (ports below 1024 need administrator rights)" if port < 1024 else ""
        return f"{where}: permission denied{below}; choose another --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return (
            f"--host {host}: not an address of this machine ({reason}); "
            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        )
    return f"{where}: cannot listen ({reason})"
