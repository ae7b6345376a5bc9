"""`autopelt dashboard`: serve optuna-dashboard on the studies' storage (127.0.0.1 unless told otherwise).

Runs optuna-dashboard's WSGI app in a threaded wsgiref server (what `optuna-dashboard` itself does without
gunicorn), over a storage that is checked first: a missing SQLite file is an error, never an empty new one.
With --study it prints that study's page and its best trial (the same one the search summary, the report and
`autopelt export` name). dashboards/README.md says which user attributes to look at.
"""

from __future__ import annotations

import argparse

from autopelt.errors import UserError
from autopelt.study.storage import DEFAULT_STORAGE

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"where the studies live: an SQLAlchemy URL (default: {DEFAULT_STORAGE})")
    parser.add_argument("--study", default=None, help="print the address of this study's page")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080; 0: any free)")


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a port number (0..65535)")
    try:
        import optuna_dashboard
    except ImportError:
        raise UserError("the dashboard needs optuna-dashboard: pip install 'autopelt[report]'") from None
    import optuna

    from autopelt.study import optuna_private
    from autopelt.study.storage import hide_password, load_study, open_existing

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_existing(args.storage)
    page, best = "dashboard/", None
    if args.study:
        study = load_study(storage, args.study, args.storage)
        page, best = f"dashboard/studies/{optuna_private.study_id(study)}", best_line(study)
    server = _listen(args.host, args.port, optuna_dashboard.wsgi(storage))
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"optuna-dashboard on {hide_password(args.storage)}: http://{host}:{server.server_port}/{page}", flush=True)
    if best:
        print(best, flush=True)
    if args.host not in LOOPBACK:
        print(f"note: listening on {args.host}: whoever reaches this machine can read and edit the studies",
              flush=True)
    print("press Ctrl-C to stop", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def best_line(study) -> str:
    """`best trial: #9 lora r8 (dev accuracy 0.7200)`: where to look first on the study's page."""
    from autopelt.study import answers
    from autopelt.study.info import read_study
    from autopelt.study.record import read_all

    best = answers.best(read_all(study), answers.maximizes(study))
    if best is None:
        return "best trial: none has completed at full fidelity yet"
    of = f", {best.dev_of}" if best.dev_of else ""
    return f"best trial: {best.label} (dev {read_study(study).metric or 'metric'} {best.dev_value:.4f}{of})"


def _listen(host: str, port: int, app):
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # Ctrl-C does not wait for the browser's open requests
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Handler(WSGIRequestHandler):
        def log_request(self, code="-", size="-") -> None:  # the page polls: log errors only
            if str(code)[:1] in ("4", "5"):
                super().log_request(code, size)

    try:
        return make_server(host, port, app, server_class=Server, handler_class=Handler)
    except OSError as error:
        raise UserError(f"cannot listen on {host}:{port}: {error.strerror or error}; "
                        "pick another --port or --host") from None
