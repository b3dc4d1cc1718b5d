"""A container's name, from what its runtime keeps on disk: no daemon socket asked.

A cgroup carries a container's id only.  Its name (``docker run --name trainer``, or the
one Docker made up) is what a person knows it by, and the runtimes keep it in files that
root can read while the container runs:

- Docker: ``<data-root>/containers/<id>/config.v2.json``, whose ``Name`` is ``/trainer``
  (``data-root`` is ``/var/lib/docker`` unless daemon.json moves it);
- Podman, Buildah, CRI-O (containers/storage): ``<root>/<driver>-containers/
  containers.json`` (and ``volatile-containers.json``), a list of ``{"id", "names"}``;
  ``<root>`` is ``/var/lib/containers/storage``, or a rootless user's
  ``~/.local/share/containers/storage``.

Asking the daemon instead (its socket) would hand the monitor a daemon's full power; the
environment's ``HOSTNAME`` is the id's first 12 digits unless ``--hostname`` was given
(and the host's own name with ``--network host``).  Where no file says (not root, another
data root, containerd alone), the name is the id's first 12 hex digits, as ``docker ps``
shows it.  Each file is read once per container, bounded in size.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable

DOCKER_ROOT = "/var/lib/docker"
STORAGE_ROOT = "/var/lib/containers/storage"
STORAGE_DRIVERS = ("overlay", "vfs", "btrfs", "zfs", "aufs", "devmapper")
MAX_FILE_BYTES = 4 << 20
# Runtimes that keep their containers in containers/storage, not in Docker's data root.
STORAGE_RUNTIMES = frozenset({"libpod", "crio", "buildah"})


def docker_name(config_v2: bytes) -> str:
    """The container's name from Docker's config.v2.json ("" if it says none)."""
    try:
        doc = json.loads(config_v2)
    except (ValueError, UnicodeDecodeError):
        return ""
    name = doc.get("Name") if isinstance(doc, dict) else None
    return name.lstrip("/") if isinstance(name, str) else ""


def storage_name(containers_json: bytes, container_id: str) -> str:
    """The container's first name from a containers/storage containers.json."""
    try:
        doc = json.loads(containers_json)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(doc, list):
        return ""
    for entry in doc:
        if isinstance(entry, dict) and entry.get("id") == container_id:
            names = entry.get("names")
            if isinstance(names, list) and names and isinstance(names[0], str):
                return names[0]
    return ""


def _read(path: str) -> bytes | None:
    """A regular file's first MAX_FILE_BYTES (not through a link, never blocking on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


class ContainerNames:
    """Container id -> name, from the runtimes' files under the roots given."""

    def __init__(
        self,
        docker_roots: Iterable[str] = (DOCKER_ROOT,),
        storage_roots: Iterable[str] = (STORAGE_ROOT,),
    ) -> None:
        self.docker_roots = tuple(docker_roots)
        self.storage_roots = tuple(storage_roots)

    def name(self, container_id: str, runtime: str = "", extra_storage: str = "") -> str:
        """The name its runtime gave it, or "" where no file here says (``extra_storage``:
        a rootless user's containers/storage root)."""
        if len(container_id) != 64 or not all(c in "0123456789abcdef" for c in container_id):
            return ""
        if runtime not in STORAGE_RUNTIMES:
            for root in self.docker_roots:
                raw = _read(f"{root}/containers/{container_id}/config.v2.json")
                if raw is not None:
                    return docker_name(raw)
        roots = (*self.storage_roots, extra_storage) if extra_storage else self.storage_roots
        for root in roots:
            for driver in STORAGE_DRIVERS:
                for file in ("containers.json", "volatile-containers.json"):
                    raw = _read(f"{root}/{driver}-containers/{file}")
                    if raw is not None:
                        found = storage_name(raw, container_id)
                        if found:
                            return found
        return ""
