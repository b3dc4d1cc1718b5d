"""Where a process was placed, from /proc/PID/cgroup texts recorded on real systems.

The texts marked "recorded" are copied exactly as their source printed them (the issue
named beside each): cgroup v1 (a line per hierarchy), hybrid (v1 controllers plus the
unified ``0::`` line) and v2 alone.  Where no recording was found, the text is built from
the layout its owner documents, and says so.  The parser is pure
(``gpumon.sample.cgroups``); the tests on cgroups a test creates itself, read through
/proc, are in test_jobs_any_node.py.
"""

from __future__ import annotations

import re

import pytest

from gpumon.sample.cgroups import Placement, parse, parse_lines, systemd_path, unescape

# --- Docker ---------------------------------------------------------------------------

# Recorded, ctrsploit/ctrsploit#280: Docker's cgroupfs driver on a hybrid host (Debian 11): the v1
# controllers and name=systemd say /docker/<id>, the unified line containerd's service.
DOCKER_HYBRID_CGROUPFS = """\
12:net_cls,net_prio:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
11:freezer:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
10:rdma:/
9:blkio:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
8:memory:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
7:perf_event:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
6:hugetlb:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
5:cpuset:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
4:devices:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
3:pids:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
2:cpu,cpuacct:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
1:name=systemd:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
0::/system.slice/containerd.service
"""

# Recorded, moby/moby#33352: cgroup v1 only, the container in every controller but name=systemd.
DOCKER_V1_SYSTEMD_ROOT = """\
13:pids:/
12:hugetlb:/
11:net_prio:/
10:perf_event:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
9:net_cls:/
8:freezer:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
7:devices:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
6:memory:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
5:blkio:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
4:cpuacct:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
3:cpu:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
2:cpuset:/docker/5dace3de0735f73d2b5048f12d41a71741a02e49668de921fdae62f7e65dc498
1:name=systemd:/
"""

# Recorded, containerd/containerd#285: Docker's systemd driver on cgroup v1, some controllers under
# /init.scope (the runtime's own placement at the time).
DOCKER_V1_SYSTEMD_DRIVER = """\
11:perf_event:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
10:memory:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
9:pids:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
8:devices:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
7:hugetlb:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
6:blkio:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
5:freezer:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
4:cpuset:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
3:cpu,cpuacct:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
2:net_cls,net_prio:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
1:name=systemd:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
"""

# Recorded, dalance/procs#236: cgroup v2, Docker's systemd driver.
DOCKER_V2 = (
    "0::/system.slice/docker-b508e2673897c4f521d858f56dab18e31ddbfc1f83300fb9793c8a4052af8f05"
    ".scope\n"
)

# --- Podman ---------------------------------------------------------------------------

# Recorded, containers/podman#20423: cgroup v2, run by root's user manager, with crun's "container"
# leaf below the scope.
PODMAN_V2_USER_MANAGER = (
    "0::/user.slice/user-0.slice/user@0.service/machine.slice/libpod-cf21d19260ace8544fe8b769f"
    "c2638bf2c0873dfbfff0b6253f0569b26a1d5eb.scope/container\n"
)

# Recorded, containers/podman#10602: cgroup v1 (Ubuntu 20.04), systemd inside the container (its
# name=systemd path ends in the container's own init.scope); the first twelve lines.
PODMAN_V1 = """\
12:pids:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
11:memory:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
10:blkio:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
9:devices:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
8:freezer:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
7:rdma:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
6:hugetlb:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
5:cpu,cpuacct:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
4:net_cls,net_prio:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
3:cpuset:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
2:perf_event:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
1:name=systemd:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope/init.scope
"""

# --- Kubernetes -----------------------------------------------------------------------

# Recorded, open-telemetry/opentelemetry-java#4507: containerd's v1 systemd driver names a pod's
# container "<pod slice>:cri-containerd:<id>"; the first six lines.
POD_CONTAINERD_V1 = """\
11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
9:cpuacct,cpu:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
8:cpuset:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
7:hugetlb:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
6:devices:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
"""

# Recorded, moby/moby#34584: a pod's container on cgroup v1, cgroupfs driver.
POD_CGROUPFS_V1 = (
    "2:cpu:/kubepods/besteffort/pod9a18ffb8-8513-11e7-b26e-7e29fbe2a5a3/"
    "d28e0087cf8f3f0429f755d60b0de415b20fcf76736ded7bab6e30e7b739ee36\n"
)

# --- Slurm ----------------------------------------------------------------------------

# Built from Slurm's documented cgroup/v2 hierarchy (slurm.schedmd.com/cgroup_v2.html):
# a task of step 0.
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0\n"
# Built from Slurm's documented cgroup/v1 hierarchy (/slurm/uid_<uid>/job_<id>/step_<n>/
# task_<t>), systemd
# keeping the task in slurmd's service; a build for several slurmd's per node names its
# root slurm_<node> (plazonic/cgroup_exporter#5).
SLURM_V1 = """\
7:freezer:/slurm/uid_1000/job_123/step_0/task_0
4:memory:/slurm/uid_1000/job_123/step_0/task_0
1:name=systemd:/system.slice/slurmd.service
"""
SLURM_V1_MULTIPLE_SLURMD = "4:cpuacct:/slurm_node7/uid_1000/job_124/step_batch/task_0\n"
# Built: a Slurm that keys its v2 tree by another id than the job's number (a directory below
# slurmstepd.scope that is not job_<id>), and one built for several slurmd's a node
# (<node>_slurmstepd.scope: treydock/cgroup_exporter#30).
SLURM_V2_OTHER_KEY = "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n"
SLURM_V2_NODE_SCOPE = "0::/system.slice/cn1_slurmstepd.scope/job_77/step_0/user/task_0\n"

# --- systemd: sessions, apps, units ---------------------------------------------------

# Recorded, gsauthof/cgmemtime#5: an ssh login on Ubuntu 22.04 and on Fedora 36, and a GNOME
# terminal (kitty) launched from the desktop.
SSH_UBUNTU = "0::/user.slice/user-1000.slice/session-3.scope\n"
SSH_FEDORA = "0::/user.slice/user-1000.slice/session-525.scope\n"
DESKTOP_TERMINAL = (
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-kitty-3842.scope\n"
)
# Recorded, containers/crun#376: "podman unshare" runs in a scope it names under the user manager.
PODMAN_UNSHARE = "0::/user.slice/user-1000.slice/user@1000.service/user.slice/podman-6696.scope\n"
# Built from pop-os/cosmic-app-library#242's listing of a user manager's cgroups: a
# desktop's autostarted app, a user service with an escaped name.
AUTOSTART = (
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
    "app-geoclue\\x2ddemo\\x2dagent@autostart.service\n"
)
# Built from systemd's documented layout (systemd.io/CGROUP_DELEGATION): a system service, a
# user service, a named scope (systemd-run --scope --unit=train), pid 1's,
# and the root of a host that runs without systemd (cgroup v2, and v1 with only the
# controllers).
SERVICE = "0::/system.slice/train.service\n"
USER_SERVICE = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/train.service\n"
NAMED_SCOPE = "0::/system.slice/train.scope\n"
INIT = "0::/init.scope\n"
ROOT_V2 = "0::/\n"
ROOT_V1 = "4:memory:/\n3:cpu,cpuacct:/\n0::/\n"
# Built: a reader in another cgroup namespace sees paths from its own root (cgroup_namespaces(7)).
OTHER_NAMESPACE = (
    "0::/../../kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice/"
    "cri-containerd-ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459.scope\n"
)

D = "2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d"
P1 = "0125ec2f-b64a-4868-8f5b-94b56cbab864"
P2 = "9a18ffb8-8513-11e7-b26e-7e29fbe2a5a3"
GEO = "app-geoclue\\x2ddemo\\x2dagent@autostart.service"


def _what(p: Placement) -> tuple[str, ...]:
    unit = re.sub("[0-9a-f]{64}", "<id>", p.unit)
    return (p.kind, p.slurm_job, p.pod_uid, p.container_id[:12], p.runtime, unit)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DOCKER_HYBRID_CGROUPFS, ("container", "", "", D[:12], "docker", "containerd.service")),
        (DOCKER_V1_SYSTEMD_ROOT, ("container", "", "", "5dace3de0735", "docker", "")),
        (
            DOCKER_V1_SYSTEMD_DRIVER,
            ("container", "", "", "b33dda97580e", "docker", "docker-<id>.scope"),
        ),
        (DOCKER_V2, ("container", "", "", "b508e2673897", "docker", "docker-<id>.scope")),
        (PODMAN_V2_USER_MANAGER, ("container", "", "", "cf21d19260ac", "libpod", "libpod-<id>.scope")),  # noqa: E501
        (PODMAN_V1, ("container", "", "", "2521e906f0a0", "libpod", "")),
        (POD_CONTAINERD_V1, ("pod", "", P1, "ee4b20e90ac7", "", "")),
        (POD_CGROUPFS_V1, ("pod", "", P2, "d28e0087cf8f", "", "")),
        (OTHER_NAMESPACE, ("pod", "", P1, "ee4b20e90ac7", "", "cri-containerd-<id>.scope")),
        (SLURM_V2, ("slurm", "3385", "", "", "", "slurmstepd.scope")),
        (SLURM_V1, ("slurm", "123", "", "", "", "slurmd.service")),
        (SLURM_V1_MULTIPLE_SLURMD, ("slurm", "124", "", "", "", "")),
        (SLURM_V2_OTHER_KEY, ("slurm", "s5K1KKYAYG5D00", "", "", "", "slurmstepd.scope")),
        (SLURM_V2_NODE_SCOPE, ("slurm", "77", "", "", "", "cn1_slurmstepd.scope")),
        (SSH_UBUNTU, ("session", "", "", "", "", "session-3.scope")),
        (SSH_FEDORA, ("session", "", "", "", "", "session-525.scope")),
        (DESKTOP_TERMINAL, ("session", "", "", "", "", "app-gnome-kitty-3842.scope")),
        (AUTOSTART, ("session", "", "", "", "", GEO)),
        (PODMAN_UNSHARE, ("unit", "", "", "", "", "podman-6696.scope")),
        (SERVICE, ("unit", "", "", "", "", "train.service")),
        (USER_SERVICE, ("unit", "", "", "", "", "train.service")),
        (NAMED_SCOPE, ("unit", "", "", "", "", "train.scope")),
        (INIT, ("", "", "", "", "", "")),
        (ROOT_V2, ("", "", "", "", "", "")),
        (ROOT_V1, ("", "", "", "", "", "")),
        ("", ("", "", "", "", "", "")),
        ("not a cgroup file\n\x00\x01", ("", "", "", "", "", "")),
    ],
)  # fmt: skip
def test_recorded_cgroups_place_their_process(text: str, expected: tuple[str, ...]) -> None:
    place = parse(text)
    assert _what(place) == expected
    assert place.cgroups == text  # two processes compare by the whole text


def test_the_full_container_id_is_kept() -> None:
    assert parse(DOCKER_HYBRID_CGROUPFS).container_id == D
    assert parse(PODMAN_V2_USER_MANAGER).user_unit  # rootless storage lives in the home


def test_a_slurm_job_id_is_numeric_only_from_job_dirs() -> None:
    assert parse(SLURM_V2).slurm_numeric
    assert not parse(SLURM_V2_OTHER_KEY).slurm_numeric  # the environment's id is better


def test_units_of_a_users_manager_are_told_from_system_units() -> None:
    assert parse(USER_SERVICE).user_unit and not parse(SERVICE).user_unit


def test_docker_in_docker_is_the_inner_container() -> None:
    inner = "f" * 64
    text = f"4:cpuacct:/docker/{D}/docker/{inner}\n"  # as dd-agent#3274 shows RancherOS
    assert parse(text).container_id == inner


def test_an_nspawn_machine_is_named_by_its_scope() -> None:
    place = parse("0::/machine.slice/machine-train\\x2dbox.scope/payload\n")
    assert (place.kind, place.container_name, place.runtime) == (
        "container",
        "train-box",
        "machine",
    )


def test_the_path_systemd_keeps() -> None:
    assert systemd_path(parse_lines(DOCKER_HYBRID_CGROUPFS)) == "/system.slice/containerd.service"
    assert systemd_path(parse_lines(SLURM_V1)) == "/system.slice/slurmd.service"
    assert systemd_path(parse_lines(DOCKER_V1_SYSTEMD_ROOT)).startswith("/docker/")
    assert systemd_path(parse_lines(ROOT_V1)) == ""
    assert unescape("a\\x2db\\x2fc") == "a-b/c"


@pytest.mark.parametrize(
    "text",
    [
        "0::/" + "a/" * 5000 + "\n",  # deep
        "0::/system.slice/" + "x" * 100_000 + ".service\n",  # a long name
        "::::\n0:\n:/\n" * 1000,  # lines that are not cgroup lines
    ],
)
def test_hostile_texts_parse_quickly_to_something(text: str) -> None:
    place = parse(text)
    assert place.kind in ("", "unit")
