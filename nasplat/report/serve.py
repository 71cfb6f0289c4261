"""`serve(folder)`: the experiment's report, live, from a small standard-library HTTP server.

The page is rebuilt in memory when `results.jsonl` or `meta.json` has changed since the last build (and
`<folder>/report.html` rewritten while the folder can be written: a read-only folder is served all the same); a few
lines of inline JavaScript poll `/version` and reload the page when it changes, so a browser left open follows a
running experiment. Routes: `/` (and `/report.html`), `/version`.

Only requests whose `Host:` header names this server are answered (`HostCheck`): a web page of another site can
point its own domain name at 127.0.0.1 (DNS rebinding) and read a local server, but its requests carry that name.
"""

from __future__ import annotations

import html
import ipaddress
import re
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from nasplat.core.checks import check_int
from nasplat.report.output import REPORT_FILE, reason
from nasplat.report.sections import render_report
from nasplat.storage import ROWS_FILE, StorageError, write_atomic

POLL_MS = 2000
LIVE_SCRIPT = """<script>
(function () {
  var version = %s;
  document.documentElement.setAttribute("data-live", "polling");
  function poll() {
    fetch("/version", {cache: "no-store"}).then(function (r) { return r.text(); }).then(function (v) {
      if (v !== version) { window.location.reload(); } else { setTimeout(poll, %d); }
    }).catch(function () { setTimeout(poll, %d); });
  }
  setTimeout(poll, %d);
})();
</script>"""


class LiveReport:
    """Builds the page of `folder` on demand, at most once per change of its results."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.built_version: str | None = None
        self.page = ""
        self.keeps_copy = True  # rewrite <folder>/report.html with each build, until a write fails

    def version(self) -> str:
        """A signature of the inputs: size and modification time of `results.jsonl` and `meta.json`."""
        parts = []
        for name in (ROWS_FILE, "meta.json"):
            try:
                stat = (self.folder / name).stat()
                parts.append(f"{stat.st_size}.{stat.st_mtime_ns}")
            except FileNotFoundError:
                parts.append("-")
        return "/".join(parts)

    def html(self) -> str:
        with self.lock:
            version = self.version()
            if version != self.built_version:
                self.page = self._render(version)
                self.built_version = version
            return self.page

    def _render(self, version: str) -> str:
        script = LIVE_SCRIPT % (_js_string(version), POLL_MS, 2 * POLL_MS, POLL_MS)
        if not (self.folder / ROWS_FILE).exists():
            body = f"<p>Waiting for {html.escape(str(self.folder / ROWS_FILE))}: the experiment has not started.</p>"
            return _page("nasplat report: waiting", body, script)
        try:
            page = render_report(self.folder)
        except Exception:  # noqa: BLE001 (a half-written experiment must not take the server down; show why, retry)
            body = f"<p>Could not build the report:</p><pre>{html.escape(traceback.format_exc())}</pre>"
            return _page("nasplat report: error", body, script)
        self._keep_copy(page)
        return page.replace("</body>", script + "</body>", 1)

    def _keep_copy(self, page: str) -> None:
        """Rewrite `<folder>/report.html` as `nasplat report` would; a folder that cannot be written is said once
        on stderr and not written again."""
        if not self.keeps_copy:
            return
        path = self.folder / REPORT_FILE
        try:
            write_atomic(path, page.encode("utf-8"))
        except StorageError as exc:
            self.keeps_copy = False
            print(f"nasplat: note: cannot keep {path} up to date ({reason(exc)}): the page is served from memory",
                  file=sys.stderr, flush=True)


def _page(title: str, body: str, script: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"</head><body><h1>{html.escape(title)}</h1>{body}{script}</body></html>\n")


def _js_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
HOST = re.compile(r"(\[[0-9a-f:.]+\]|[^:\[\]\s]+)(?::(\d{1,5}))?")


def host_port(header: str, default_port: int = 80) -> str | None:
    """A `Host:` value as `name:port` (the name in lower case, the port 80 when left out); None when malformed."""
    match = HOST.fullmatch(header.strip().lower())
    return f"{match.group(1)}:{int(match.group(2) or default_port)}" if match else None


class HostCheck:
    """The `Host:` headers a server answers: `localhost`, `127.0.0.1`, `[::1]`, the address it is bound to and the
    host it was given, each with its port, and the `allowed` names (`NAME` at its port, or `NAME:PORT`, for a
    tunnel's). Bound to every interface (0.0.0.0), any IP address at its port too: a page of another site reaches
    a server by its own domain name, never by an address."""

    def __init__(self, bound: str, port: int, host: str, allowed: tuple[str, ...] = ()) -> None:
        self.port, self.any_address = port, bound in ("0.0.0.0", "::", "")
        names = [f"[{name}]" if ":" in name and not name.startswith("[") else name
                 for name in (*LOOPBACK_NAMES, bound, host) if name]
        own = [host_port(name, port) for name in names]
        given = [(name, host_port(name, port)) for name in allowed]
        bad = [name for name, parsed in given if parsed is None]
        if bad:
            raise ValueError(f"--allow-host must be a host name or address with an optional :port, got {bad[0]!r}")
        self.allowed = [p for p in dict.fromkeys([*own, *(p for _, p in given)]) if p is not None]

    def refusal(self, header: str | None) -> str:
        """'' when `header` (None: no `Host:` header) names this server, else the one-line reason to refuse."""
        named = host_port(header, 80) if header is not None else None
        if named in self.allowed:
            return ""
        if named is not None and self.any_address and named.endswith(f":{self.port}"):
            try:
                ipaddress.ip_address(named.rsplit(":", 1)[0].strip("[]"))
                return ""
            except ValueError:
                pass
        shown = "no Host header" if header is None else f"Host {header!r}"
        return (f"403: {shown} is not an address of this server (allowed: {', '.join(self.allowed)}): "
                "refused, as a page of another site could reach this server by DNS rebinding; nasplat serve "
                "--allow-host NAME allows a name\n")


def _handler(live: LiveReport) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server: ReportServer

        def do_GET(self) -> None:  # http.server's naming
            path = self.path.split("?", 1)[0]
            refusal = self.server.host_check.refusal(self.headers.get("Host"))
            if refusal:
                self._send(403, refusal, "text/plain; charset=utf-8")
            elif path in ("/", "/report.html", "/index.html"):
                self._send(200, live.html(), "text/html; charset=utf-8")
            elif path == "/version":
                self._send(200, live.version(), "text/plain; charset=utf-8")
            else:
                self._send(404, f"not found: {path!r}; routes: /, /report.html, /version\n", "text/plain")

        def _send(self, code: int, text: str, content_type: str) -> None:
            payload = text.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:  # quiet: one line per poll is noise
            pass

    return Handler


class ReportServer(ThreadingHTTPServer):
    """A threading HTTP server already serving from a background thread; `serve_forever()` from any other
    thread blocks until `shutdown()` instead of starting a second loop on the same socket."""

    daemon_threads = True
    background: threading.Thread | None = None
    host_check: HostCheck

    @property
    def bound_address(self) -> tuple[str, int]:
        """The host and port the socket is bound to (an IPv6 socket's address has two more fields, left out)."""
        host, port = self.server_address[:2]
        return (host if isinstance(host, str) else bytes(host).decode()), int(port)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if self.background is None or threading.current_thread() is self.background:
            super().serve_forever(poll_interval)
            return
        while self.background.is_alive():
            self.background.join(poll_interval)  # short joins: Ctrl-C reaches the caller

    def start(self, name: str) -> None:
        self.background = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        self.background.start()


def serve(folder: str | Path, port: int = 0, host: str = "127.0.0.1",
          allow_hosts: tuple[str, ...] = ()) -> tuple[ReportServer, str]:
    """Serve the live report of `folder` from a background thread; returns the server and its URL.

    `port=0` picks a free port. Requests are answered only when their `Host:` header names this server (see
    `HostCheck`; `allow_hosts` adds names). `server.serve_forever()` blocks until `server.shutdown()`; free the
    socket with `server.server_close()`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"experiment folder {folder} does not exist")
    check_int("port", port, minimum=0, maximum=65535, note="0: any free port")
    server = ReportServer((host, port), _handler(LiveReport(folder)))
    bound_host, bound_port = server.bound_address
    try:
        server.host_check = HostCheck(bound_host, bound_port, host.lower(), tuple(allow_hosts))
    except ValueError:
        server.server_close()
        raise
    server.start(f"nasplat-serve-{folder.name}")
    shown = "127.0.0.1" if bound_host in ("0.0.0.0", "") else (f"[{bound_host}]" if ":" in bound_host else bound_host)
    return server, f"http://{shown}:{bound_port}/"


def listen_address(server: ReportServer) -> str:
    """The `host:port` the server's socket is really bound to."""
    host, port = server.bound_address
    return f"{host}:{port}"


def is_loopback_only(server: ReportServer) -> bool:
    """Whether only this machine can connect: the socket is bound to a loopback address."""
    try:
        return ipaddress.ip_address(server.bound_address[0]).is_loopback
    except ValueError:  # a host name that did not resolve to a literal address
        return False


def serve_forever(folder: str | Path, port: int = 0, host: str = "127.0.0.1",
                  allow_hosts: tuple[str, ...] = ()) -> None:
    """Serve the live report until interrupted (Ctrl-C). Prints the address the server listens on and where to
    open the page; warns on stderr when the socket is reachable from other machines."""
    server, url = serve(folder, port, host, allow_hosts)
    print(f"nasplat: serving the live report of {folder}, listening on {listen_address(server)}; open {url} "
          "(Ctrl-C to stop)", flush=True)
    if not is_loopback_only(server):
        print(f"nasplat: warning: listening on {listen_address(server)}, not on loopback: anyone who can reach this "
              "machine on that port can read the report; use --host 127.0.0.1 and an SSH tunnel to keep it private",
              file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
