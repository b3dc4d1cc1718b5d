"""`gpumon serve`: the node daemon — Prometheus metrics, a JSON-lines log, job labels.

Thin: it reads the configuration, builds the Monitor (the only way to samples), the
daemon state, the collector and the HTTP server, then paces ticks until SIGTERM/SIGINT.
SIGHUP reopens the log (logrotate).  Exit status: 0 on a signal, 2 for a bad
configuration, 3 without a usable driver, 1 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from gpumon.faces.common import positive_float
from gpumon.faces.serve import config as serve_config
from gpumon.monitor import StopFlag, paced

if TYPE_CHECKING:
    from gpumon.faces.serve.log import EventLog


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run as a node daemon: Prometheus metrics, a JSON-lines log, job labels",
        description="Sample every GPU continuously, classify each as healthy, starved, "
        "sync-stalled or idle, attribute GPUs to Slurm jobs and Kubernetes pods, serve "
        "Prometheus metrics and write episodes to a JSON-lines log.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML configuration (default {serve_config.DEFAULT_PATH}, used if present)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"address to serve /metrics on (default {serve_config.DEFAULT_ADDRESS}:"
        f"{serve_config.DEFAULT_PORT})",
    )
    p.add_argument("--log", metavar="FILE", help="JSON-lines event log ('' for none)")
    p.add_argument(
        "--interval",
        type=positive_float,
        metavar="S",
        help="seconds between ticks (default 1; the driver's sub-second samples between "
        "ticks are kept whatever the interval)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import disable_created_metrics

    from gpumon.faces.common import build_monitor
    from gpumon.faces.serve.collector import make_registry
    from gpumon.faces.serve.daemon import ServeState
    from gpumon.faces.serve.http import MetricsServer
    from gpumon.faces.serve.log import EventLog

    cfg = serve_config.with_overrides(
        serve_config.load(args.config),
        listen=args.listen,
        log=args.log,
        interval_s=args.interval,
    )
    disable_created_metrics()
    monitor = build_monitor(interval_s=cfg.interval_s)  # NoDriverError -> exit 3
    log = EventLog(None)
    state = ServeState(monitor, cfg, log)
    server = MetricsServer(cfg, make_registry(state))  # port in use -> one sentence, exit 1
    log = state.log = EventLog(cfg.log_path)
    stop = StopFlag().install()
    hup_previous = _install_hup(log)
    server.start()
    scheme = "https" if cfg.tls else "http"
    print(
        f"gpumon: serving {len(state.gpus)} GPU(s) on {scheme}://{_host(cfg.address)}:"
        f"{server.port}/metrics every {cfg.interval_s:g} s"
        + (f", log {cfg.log_path}" if cfg.log_path else ""),
        file=sys.stderr,
        flush=True,
    )
    start = state.summary("start")
    start["listen"] = f"{cfg.address}:{server.port}"
    start["interval_s"] = cfg.interval_s
    log.write(start)
    try:
        for _ in paced(cfg.interval_s, stop.event):
            if log.reopen_wanted:
                log.reopen()
                log.write({"time": time.time(), "event": "log_reopened"})
            state.step()
    finally:
        stop.restore()
        if hup_previous is not None:
            signal.signal(signal.SIGHUP, hup_previous)
        reason = "signal " + signal.Signals(stop.signal).name if stop.signal else "stopped"
        state.finish(reason)
        server.close()
        log.close()
    print(f"gpumon: stopped ({reason}) after {state.ticks_total} ticks.", file=sys.stderr)
    return 0


def _install_hup(log: EventLog) -> Any:
    """SIGHUP (logrotate's postrotate) -> reopen the log at the next tick (no I/O here)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handle(_signum: int, _frame: object) -> None:
        log.request_reopen()

    return signal.signal(signal.SIGHUP, handle)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
