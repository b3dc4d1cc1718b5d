#!/usr/bin/python3
"""gpumon's node summary for PCP's OpenMetrics agent (pmdaopenmetrics), for `pcp dstat --gpumon`.

Install executable as /var/lib/pcp/pmdas/openmetrics/config.d/gpumon_node.py: the agent runs it
on every fetch and publishes what it prints as openmetrics.gpumon_node.<name>.  It reads
`gpumon serve`'s /metrics and prints label-free numbers (GPUs per state, mean utilisation,
memory), because pcp-dstat columns cannot select one label value of a metric portably
(derived `matchinst()` returns nothing for these instances on PCP 6.0) and `sum()`/`avg()`
accept only metric names.  Standard library only: it runs under PCP's python3, not gpumon's.

GPUMON_METRICS_URL overrides where gpumon serve listens (default below).
"""

import math
import os
import re
import sys
import urllib.request

URL = os.environ.get("GPUMON_METRICS_URL", "http://localhost:9977/metrics")
STATES = ("healthy", "starved", "sync_stall", "idle", "unknown")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """(name, labels, value) for every sample line of a Prometheus/OpenMetrics exposition."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        yield m.group(1), dict(LABEL.findall(m.group(3) or "")), value


def summarise(samples):
    """Node-level numbers: GPUs per state, lost GPUs, mean utilisation %, memory used %."""
    util, used, total, lost = {}, {}, {}, {}
    states = dict.fromkeys(STATES, 0)
    gpus = set()
    for name, labels, value in samples:
        gpu = labels.get("gpu")
        if gpu is None or math.isnan(value):
            continue
        if name == "gpumon_gpu_state" and value == 1 and labels.get("state") in states:
            states[labels["state"]] += 1
            gpus.add(gpu)
        elif name == "gpumon_gpu_utilization_ratio":
            util[gpu] = value
        elif name == "gpumon_gpu_memory_used_bytes":
            used[gpu] = value
        elif name == "gpumon_gpu_memory_total_bytes":
            total[gpu] = value
        elif name == "gpumon_gpu_lost":
            lost[gpu] = value
            gpus.add(gpu)
    out = {"gpus": len(gpus), "gpus_lost": sum(1 for v in lost.values() if v >= 1)}
    for state, n in states.items():
        out["gpus_" + state] = n
    if util:
        out["util_pct"] = 100.0 * sum(util.values()) / len(util)
    both = [g for g in used if total.get(g)]
    if both:
        out["mem_pct"] = 100.0 * sum(used[g] for g in both) / sum(total[g] for g in both)
    return out


def render(summary):
    lines = []
    for name, value in summary.items():
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {float(value)!r}")
    return "\n".join(lines) + "\n"


def main():
    try:
        with urllib.request.urlopen(URL, timeout=2) as resp:
            text = resp.read().decode("utf-8", "replace")
    except Exception as exc:  # the agent logs stderr; no output means no values this fetch
        print(f"gpumon_node: cannot read {URL}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(summarise(parse(text))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
