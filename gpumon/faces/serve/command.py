"""`gpumon serve`: the node daemon — Prometheus metrics, a JSON-lines log, job labels.

Thin: it reads the configuration (TOML, plus an exporter-toolkit ``--web.config.file``),
asks the session for the node's samplers and detector, builds the daemon state, the
collector and the HTTP server, then paces ticks until SIGTERM/SIGINT.  SIGHUP reopens the
log (logrotate).
Under systemd (``Type=notify``) it says READY=1 once it serves and has sampled, and feeds
the watchdog while ticks keep completing.  Exit status: 0 on a signal, 2 for a bad
configuration, 3 without a usable driver, 1 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from gpumon import __version__
from gpumon.engine import LiveOptions, Session
from gpumon.errors import ConfigError, GpumonError
from gpumon.faces.common import interval
from gpumon.faces.serve import config as serve_config
from gpumon.faces.serve.stderrlog import FORMATS as LOG_FORMATS
from gpumon.faces.serve.stderrlog import formatter
from gpumon.loop import StopFlag, paced

if TYPE_CHECKING:
    from gpumon.faces.serve.config import ServeConfig
    from gpumon.faces.serve.log import EventLog

LOG_LEVELS = ("debug", "info", "warn", "error")
# What other exporters and servers call the options gpumon names as node_exporter does.
OPTION_HINTS = {
    name: "--web.listen-address HOST:PORT, or :PORT for every address"
    for name in ("--port", "-p", "--bind", "--host", "--address", "--listen-address")
} | {"--metrics-path": "--web.telemetry-path PATH", "--config.file": "--config FILE"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        # A daemon's options are written once, in a unit file: each exactly (node_exporter's
        # are), so --collector.gpu is refused, not taken for --collector.gpus.
        allow_abbrev=False,
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
        "--web.listen-address",
        "--listen",
        dest="listen",
        metavar="HOST:PORT",
        help=f"address to serve on (default {serve_config.DEFAULT_ADDRESS}:"
        f"{serve_config.DEFAULT_PORT}; ':PORT' for every address, '[::1]:PORT' for IPv6)",
    )
    p.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        metavar="PATH",
        help=f"path of the metrics (default {serve_config.DEFAULT_TELEMETRY_PATH})",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="exporter-toolkit web configuration (YAML): TLS, basic auth, headers",
    )
    p.add_argument("--log", metavar="FILE", help="JSON-lines event log ('' for none)")
    p.add_argument(
        "--log.level",
        dest="log_level",
        choices=LOG_LEVELS,
        default="info",
        help="what gpumon says on stderr (default info; debug adds failed HTTP clients)",
    )
    p.add_argument(
        "--log.format",
        dest="log_format",
        choices=LOG_FORMATS,
        help="format of what gpumon says on stderr, as node_exporter's flag (default: "
        "'gpumon: ...' lines); the events log (--log) is JSON lines whatever this says",
    )
    p.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version, the commit it was built from and Python's, then exit",
    )
    p.add_argument(
        "--interval",
        type=interval,
        metavar="S",
        help="seconds between ticks (default 1; the driver's sub-second samples between "
        "ticks are kept whatever the interval)",
    )
    for group in serve_config.COLLECTORS:
        p.add_argument(
            f"--collector.{group}",
            dest=f"collector_{group}",
            action=argparse.BooleanOptionalAction,
            help=f"export the {group} group of metrics ({COLLECTOR_HELP[group]}); on by "
            "default, or as [collectors] in the configuration says",
        )
    p.set_defaults(func=run, option_hints=OPTION_HINTS)


# What each group of metrics holds, for --help (docs/serve.md lists every series).
COLLECTOR_HELP = {
    "build": "gpumon_build_info",
    "gpus": "each GPU's utilisation, memory, power, processes, GPM activity and jobs",
    "hardware": "temperatures, clocks, fan, P-state, energy, ECC, row remapping, PCIe, "
    "NVLink, XID, encoder and decoder: not read from NVML when off",
    "detection": "each GPU's and the node's state, cause, reason, gaps and bursts",
    "jobs": "each job's state, reason and GPUs",
    "host": "the host's CPU and iowait",
    "health": "gpumon's own ticks, errors, log and HTTP clients",
}


def load_config(args: argparse.Namespace) -> ServeConfig:
    """The TOML file, the command line over it, then the web configuration merged in."""
    cfg = serve_config.with_overrides(
        serve_config.load(args.config),
        listen=args.listen,
        log=args.log,
        interval_s=args.interval,
        telemetry=args.telemetry_path,
        web_config_file=args.web_config_file,
        collectors=collector_switches(args),
    )
    if cfg.web_config_file is not None:
        from gpumon.faces.serve import webconfig  # PyYAML only for a web configuration

        cfg = serve_config.with_web_config(cfg, webconfig.load(cfg.web_config_file))
    return cfg


def collector_switches(args: argparse.Namespace) -> dict[str, bool]:
    """The groups switched on (--collector.X) or off (--no-collector.X) on the command line."""
    given = ((g, getattr(args, f"collector_{g}", None)) for g in serve_config.COLLECTORS)
    return {group: on for group, on in given if on is not None}


class _VersionAction(argparse.Action):
    """``gpumon serve --version``, worded as node_exporter's (the commit read only if asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        import platform

        from gpumon.faces.serve.buildinfo import revision

        sys.stdout.write(
            f"gpumon serve, version {__version__} (revision: {revision() or 'unknown'})\n"
            f"  python version: {platform.python_version()}\n"
            f"  platform: {platform.system().lower()}/{platform.machine()}\n"
        )
        parser.exit()


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; an error is said on stderr in --log.format, as the rest is."""
    _log_to_stderr(args.log_level, args.log_format)
    try:
        return _serve(args)
    except GpumonError as exc:
        logging.getLogger("gpumon").error("%s", exc)
        return exc.exit_status


def _serve(args: argparse.Namespace) -> int:
    from gpumon.faces.serve.daemon import (
        detector_config,
        job_options,
        reads_hardware,
        stack_options,
    )
    from gpumon.faces.serve.http import exposure_warning, key_file_warning
    from gpumon.faces.serve.notify import Notifier, Watchdog, stale_after_s, watchdog_period_s
    from gpumon.faces.serve.runner import Daemon

    say = logging.getLogger("gpumon.serve")
    cfg = load_config(args)
    _make_log_folder(cfg.log_path, say)
    stacks = stack_options(cfg)
    if stacks is not None:
        try:
            Session.check_stacks(stacks)
        except GpumonError as exc:  # the daemon serves on without them
            say.warning(f"{exc} Serving without stacks.")
            stacks = None
    session = Session.live(  # no driver: status 3
        LiveOptions(interval_s=cfg.interval_s, hardware=reads_hardware(cfg)),
        jobs=job_options(cfg),
        config=detector_config(cfg),
        stacks=stacks,
    )
    # A stop asked for from the moment the port and the log exist ends the run cleanly (a
    # SIGTERM between opening the port and the loop killed the process outright).
    stop = StopFlag().install()
    try:
        daemon = Daemon(session, cfg)  # port in use -> one sentence, exit 1
    except BaseException:
        stop.restore()
        raise
    state = daemon.state
    hup_previous = _install_hup(daemon.log)
    daemon.start(listen=f"{cfg.address}:{daemon.port}", interval_s=cfg.interval_s)
    scheme = "https" if cfg.tls else "http"
    where = f"{scheme}://{_host(cfg.address)}:{daemon.port}{cfg.telemetry_path}"
    say.info(
        f"serving {len(state.gpus)} GPU(s) on {where} every {cfg.interval_s:g} s"
        + (", basic auth" if cfg.basic_auth else "")
        + (f", log {cfg.log_path}" if cfg.log_path else "")
    )
    for warning in (exposure_warning(cfg), key_file_warning(cfg)):
        if warning is not None:
            say.warning(warning.removeprefix("gpumon: "))
    notifier = Notifier()
    period = watchdog_period_s()
    watchdog = (
        Watchdog(notifier, period, stale_after_s(cfg.interval_s, period))
        if notifier.enabled and period is not None
        else None
    )
    ready = False
    try:
        for _ in paced(cfg.interval_s, stop.event):
            daemon.step()
            if watchdog is not None:
                watchdog.beat()
            if not ready:  # serving and sampled once: systemd may call the unit started
                ready = True
                notifier.send("READY=1", f"STATUS=serving {len(state.gpus)} GPU(s) on {where}")
                if watchdog is not None:
                    watchdog.start()
    finally:
        notifier.send("STOPPING=1")
        if watchdog is not None:
            watchdog.stop()
        stop.restore()
        if hup_previous is not None:
            signal.signal(signal.SIGHUP, hup_previous)
        reason = "signal " + signal.Signals(stop.signal).name if stop.signal else "stopped"
        daemon.close(reason)
    say.info(f"stopped ({reason}) after {state.ticks_total} ticks.")
    return 0


def _make_log_folder(path: str | None, say: logging.Logger) -> None:
    """The log's folder, made if missing (0750); a ConfigError when it cannot be."""
    if not path:
        return
    from gpumon.faces.serve.log import make_folder

    try:
        created = make_folder(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the folder {exc.filename} for the log {path}: "
            f"{(exc.strerror or str(exc)).lower()}."
        ) from None
    if created:
        say.info(f"created the log's folder {created[-1]} (mode 0750).")


def _log_to_stderr(level: str, fmt: str | None = None) -> None:
    """What the daemon says (serving, stopped, a GPU lost or back, a failed HTTP client at
    debug, the error that ends it) on stderr, one line each: 'gpumon: ...' like every gpumon
    command, or logfmt or JSON (--log.format).  Today's stderr: an earlier run's handler,
    in the same process, is replaced."""
    logger = logging.getLogger("gpumon")
    for old in [h for h in logger.handlers if getattr(h, "gpumon_serve", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.gpumon_serve = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel({"warn": logging.WARNING}.get(level, getattr(logging, level.upper())))
    logger.propagate = False


def _install_hup(log: EventLog) -> Any:
    """SIGHUP (logrotate's postrotate) -> reopen the log at the next tick (no I/O here)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handle(_signum: int, _frame: object) -> None:
        log.request_reopen()

    return signal.signal(signal.SIGHUP, handle)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
