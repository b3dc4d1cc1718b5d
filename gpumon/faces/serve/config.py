"""The daemon's configuration: a TOML file plus command-line overrides, checked whole.

A bad file is reported with the file, the line and the key, and nothing starts: a daemon
running on half a config (say TLS silently off because of a typo in a key) is worse than
one that refuses to start.  A missing *default* file means defaults (a fresh install); a
missing file named with ``--config`` is an error.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumon.errors import ConfigError
from gpumon.faces.common import HANG_AFTER_MAX_S, HANG_AFTER_MIN_S, check_interval
from gpumon.files import CONFIG_LIMIT, read_text_bounded

if TYPE_CHECKING:  # read only with --web.config.file: PyYAML is not loaded otherwise
    from gpumon.faces.serve.webconfig import WebConfig

DEFAULT_PATH = Path("/etc/gpumon/gpumon.toml")
# 9400 is dcgm-exporter's, 9835 nvidia_gpu_exporter's, 8000 nvitop-exporter's; 9977 is
# used by none of them (see docs/serve.md on the choice).
DEFAULT_PORT = 9977
DEFAULT_ADDRESS = "127.0.0.1"
# Where jobs are found (docs/serve.md "How jobs are found"); all by default.
JOB_SOURCES = ("slurm", "kubernetes", "containers", "units", "processes")
DEFAULT_TELEMETRY_PATH = "/metrics"
# The groups of metrics serve exports, each switched as node_exporter's collectors are
# (--[no-]collector.<group>, [collectors] <group> = true|false): the names
# gpumon_scrape_group_success{group} gives them; all on by default.
COLLECTORS = ("build", "gpus", "hardware", "detection", "jobs", "host", "health")
# Paths the server answers itself; the metrics cannot live there.
RESERVED_PATHS = ("/", "/-/healthy", "/-/ready")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `gpumon serve` needs, with the defaults of a fresh install."""

    address: str = DEFAULT_ADDRESS
    port: int = DEFAULT_PORT
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    # With a client CA, clients must present a certificate unless this is set to false.
    tls_client_auth_required: bool = True
    tls_client_ca_pem: str | None = None  # a client CA given inline (web config client_ca)
    tls_min_version: str = "TLS12"
    tls_max_version: str = "TLS13"
    # From a --web.config.file: (user, bcrypt hash) pairs; response headers; rate limit.
    basic_auth_users: tuple[tuple[str, str], ...] = ()
    http_headers: tuple[tuple[str, str], ...] = ()
    rate_limit_interval_s: float = 0.0
    rate_limit_burst: int = 0
    telemetry_path: str = DEFAULT_TELEMETRY_PATH
    web_config_file: str | None = None
    interval_s: float = 1.0
    log_path: str | None = None
    summary_interval_s: float = 300.0
    job_sources: tuple[str, ...] = JOB_SOURCES
    # The groups of metrics exported, in COLLECTORS' order; a group switched off is not
    # built, and what only it reads is not read (the hardware's NVML readings).
    collectors: tuple[str, ...] = COLLECTORS
    # Per-job detectors are dropped this long after the job's last GPU process left.
    job_linger_s: float = 60.0
    max_jobs: int = 64
    # Sample each job's process tree (its lowest GPU pid and descendants: DataLoader
    # workers hold no CUDA context) so a starved GPU's cause can be named.
    process_trees: bool = True
    # A job whose every GPU spins in a collective with none computing this long is hung
    # (the detector's hang_after_s; PyTorch's NCCL watchdog aborts at 10 minutes).
    hang_after_s: float = 300.0
    # Read the jobs' Python stacks while a GPU waits (py-spy, gpumon-why[stacks]): off by
    # default, since it reads other users' processes (it needs ptrace: root).
    stacks_enabled: bool = False
    stacks_every_s: float = 10.0  # one window: stacks arrive this often while a GPU waits
    source: str | None = field(default=None, compare=False)  # the file it came from

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def basic_auth(self) -> bool:
        return bool(self.basic_auth_users)


# --- value checks: each returns the clean value or raises ValueError(reason) -------------


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"must be a string, not {v!r}")
    return v


def _nonempty_str(v: Any) -> str:
    if not _str(v).strip():
        raise ValueError("must not be empty")
    return v


def _optional_path(v: Any) -> str | None:
    """A path, or "" for none."""
    return _str(v) or None


def _port(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise ValueError(f"must be an integer from 1 to 65535, not {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, not {v!r}")
    return v


def _seconds(lo: float, hi: float) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"must be a number of seconds, not {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g} seconds, not {v!r}")
        return float(v)

    return check


def _count(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"must be an integer from {lo} to {hi}, not {v!r}")
        return v

    return check


def telemetry_path(v: Any) -> str:
    """Where the metrics are served: an absolute path of its own (not / or /-/...)."""
    path = _str(v)
    if not path.startswith("/") or any(c.isspace() or c in "?#" for c in path):
        raise ValueError(f"must be a path such as /metrics, not {path!r}")
    if path in RESERVED_PATHS or path.startswith("/-/"):
        raise ValueError(f"{path} is gpumon's own page; choose another, such as /metrics")
    return path


def _sources(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"must be a list of strings, not {v!r}")
    bad = [s for s in v if s not in JOB_SOURCES]
    if bad:
        raise ValueError(f"unknown source {bad[0]!r} (known: {', '.join(JOB_SOURCES)})")
    return tuple(dict.fromkeys(v))


# section -> key -> (ServeConfig field, check)
SCHEMA: dict[str, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "http": {
        "address": ("address", _nonempty_str),
        "port": ("port", _port),
        "tls_cert_file": ("tls_cert_file", _optional_path),
        "tls_key_file": ("tls_key_file", _optional_path),
        "tls_client_ca_file": ("tls_client_ca_file", _optional_path),
        "tls_client_auth_required": ("tls_client_auth_required", _bool),
        "telemetry_path": ("telemetry_path", telemetry_path),
        "web_config_file": ("web_config_file", _optional_path),
    },
    "sampling": {
        "interval_s": ("interval_s", check_interval),
    },
    "log": {
        "path": ("log_path", _optional_path),
        "summary_interval_s": ("summary_interval_s", _seconds(1.0, 86400.0)),
    },
    "jobs": {
        "sources": ("job_sources", _sources),
        "linger_s": ("job_linger_s", _seconds(0.0, 86400.0)),
        "max_jobs": ("max_jobs", _count(0, 4096)),
        "process_trees": ("process_trees", _bool),
    },
    "detector": {
        "hang_after_s": ("hang_after_s", _seconds(HANG_AFTER_MIN_S, HANG_AFTER_MAX_S)),
    },
    "stacks": {
        "enabled": ("stacks_enabled", _bool),
        "every_s": ("stacks_every_s", _seconds(1.0, 120.0)),
    },
    # One switch per group: together they set ServeConfig.collectors.
    "collectors": {group: ("collectors", _bool) for group in COLLECTORS},
}


def switched(enabled: tuple[str, ...], switches: Mapping[str, bool]) -> tuple[str, ...]:
    """The groups exported once ``switches`` (group -> on) are applied to ``enabled``."""
    return tuple(g for g in COLLECTORS if switches.get(g, g in enabled))


def key_line(text: str, section: str, key: str | None = None) -> int | None:
    """The 1-based line of ``[section]`` (or of ``key`` inside it) in TOML ``text``.

    tomllib reports lines only for syntax errors; for a bad value or an unknown key the
    user still needs to be pointed at the line, so the text is searched (plain tables
    and ``section.key = ...`` dotted keys; good enough for a config file).
    """
    current = ""
    header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\s*(#.*)?$")
    for n, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            current = m.group(1).replace('"', "").replace(" ", "")
            if key is None and current == section:
                return n
            continue
        if key is None:
            continue
        stripped = line.strip()
        if current == section and re.match(rf'^"?{re.escape(key)}"?\s*=', stripped):
            return n
        if current == "" and re.match(
            rf"^{re.escape(section)}\s*\.\s*{re.escape(key)}\s*=", stripped
        ):
            return n
    return None


def _error(path: str, text: str, section: str, key: str | None, reason: str) -> ConfigError:
    line = key_line(text, section, key)
    where = f"{path}:{line}" if line is not None else path
    name = f"[{section}] {key}" if key is not None else f"[{section}]"
    return ConfigError(f"{where}: {name}: {reason}; gpumon serve did not start.")


def parse(text: str, path: str = "<config>") -> ServeConfig:
    """Build a ServeConfig from TOML text; any problem raises ConfigError naming the line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message already ends with "(at line N, column M)".
        raise ConfigError(f"{path}: not valid TOML: {exc}; gpumon serve did not start.") from None
    values: dict[str, Any] = {}
    switches: dict[str, bool] = {}
    for section, body in data.items():
        if section not in SCHEMA:
            known = ", ".join(f"[{s}]" for s in SCHEMA)
            raise _error(path, text, section, None, f"unknown section (known: {known})")
        if not isinstance(body, dict):
            raise _error(path, text, section, None, "must be a table ([section] header)")
        for key, value in body.items():
            spec = SCHEMA[section].get(key)
            if spec is None:
                known = ", ".join(SCHEMA[section])
                raise _error(path, text, section, key, f"unknown key (known: {known})")
            attr, check = spec
            try:
                checked = check(value)
            except ValueError as exc:
                raise _error(path, text, section, key, str(exc)) from None
            if attr == "collectors":
                switches[key] = checked
            else:
                values[attr] = checked
    cfg = ServeConfig(**values, collectors=switched(COLLECTORS, switches), source=path)
    return _check_tls(cfg, text, path)


def _check_tls(cfg: ServeConfig, text: str, path: str) -> ServeConfig:
    if (cfg.tls_cert_file is None) != (cfg.tls_key_file is None):
        missing = "tls_key_file" if cfg.tls_key_file is None else "tls_cert_file"
        present = "tls_cert_file" if missing == "tls_key_file" else "tls_key_file"
        raise _error(path, text, "http", present, f"needs {missing} as well")
    if cfg.tls_client_ca_file is not None and cfg.tls_cert_file is None:
        raise _error(
            path,
            text,
            "http",
            "tls_client_ca_file",
            "client certificates (mTLS) need tls_cert_file and tls_key_file",
        )
    return cfg


def load(path: str | None) -> ServeConfig:
    """Read ``path`` (None: the default file, which may be absent)."""
    explicit = path is not None
    target = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = read_text_bounded(target, CONFIG_LIMIT)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{target}: no such configuration file.") from None
        return ServeConfig()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{target}: cannot read the configuration: {reason}.") from None
    return parse(text, str(target))


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all addresses) or ``[v6addr]:PORT`` -> (host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%a-zA-Z]+)\]:(\d+)|([^:\[\]]*):(\d+)", text.strip())
    if not m:
        raise ConfigError(
            f"--web.listen-address (--listen) {text!r}: expected HOST:PORT, e.g. "
            f"127.0.0.1:{DEFAULT_PORT}."
        )
    host = m.group(1) or m.group(3) or "0.0.0.0"
    port = int(m.group(2) or m.group(4))
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"--web.listen-address (--listen) {text!r}: the port must be from 1 to 65535."
        )
    return host, port


def with_overrides(
    cfg: ServeConfig,
    *,
    listen: str | None = None,
    log: str | None = None,
    interval_s: float | None = None,
    telemetry: str | None = None,
    web_config_file: str | None = None,
    collectors: Mapping[str, bool] | None = None,
) -> ServeConfig:
    """Command-line options win over the file (``collectors``: group -> on, the groups
    switched on the command line)."""
    if listen is not None:
        host, port = parse_listen(listen)
        cfg = replace(cfg, address=host, port=port)
    if telemetry is not None:
        try:
            cfg = replace(cfg, telemetry_path=telemetry_path(telemetry))
        except ValueError as exc:
            raise ConfigError(f"--web.telemetry-path: {exc}.") from None
    if web_config_file is not None:
        cfg = replace(cfg, web_config_file=web_config_file or None)
    if log is not None:
        cfg = replace(cfg, log_path=log or None)
    if interval_s is not None:
        try:
            cfg = replace(cfg, interval_s=check_interval(interval_s))
        except ValueError as exc:
            raise ConfigError(f"--interval: {exc}.") from None
    if collectors:
        unknown = sorted(set(collectors) - set(COLLECTORS))
        if unknown:
            raise ConfigError(
                f"--collector.{unknown[0]}: no such group of metrics (known: "
                f"{', '.join(COLLECTORS)}); gpumon serve did not start."
            )
        cfg = replace(cfg, collectors=switched(cfg.collectors, collectors))
    return cfg


def with_web_config(cfg: ServeConfig, web: WebConfig) -> ServeConfig:
    """The web configuration file's TLS, users, headers and rate limit, merged in.

    TLS set in both files is refused: which of two certificates would be served is not a
    question a daemon should answer silently.
    """
    if web.tls and cfg.tls:
        raise ConfigError(
            f"TLS is configured twice, in {cfg.source or 'the configuration'} ([http] "
            f"tls_cert_file) and in {web.source} (tls_server_config); keep one; gpumon "
            "serve did not start."
        )
    from gpumon.faces.serve.webconfig import CLIENT_AUTH_TYPES

    if web.tls:
        needs_ca, required = CLIENT_AUTH_TYPES[web.client_auth_type]
        cfg = replace(
            cfg,
            tls_cert_file=web.tls_cert_file,
            tls_key_file=web.tls_key_file,
            tls_client_ca_file=web.tls_client_ca_file if needs_ca else None,
            tls_client_ca_pem=web.tls_client_ca_pem if needs_ca else None,
            tls_client_auth_required=required,
            tls_min_version=web.tls_min_version,
            tls_max_version=web.tls_max_version,
        )
    return replace(
        cfg,
        basic_auth_users=web.basic_auth_users,
        http_headers=web.headers,
        rate_limit_interval_s=web.rate_limit_interval_s,
        rate_limit_burst=web.rate_limit_burst,
    )
