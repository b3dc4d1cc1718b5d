"""The ``gpus`` group: each GPU, what it is doing and who holds it."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from gpumon.faces.serve.collectors.base import GPU, JOB, GroupCollector, add


class GpusCollector(GroupCollector):
    """Identity, loss, utilisation, memory, power, processes, GPM activity and the jobs of
    every GPU: what ``nvidia-smi`` shows and the detector reads."""

    group = "gpus"
    names = (
        "gpumon_gpu_info",
        "gpumon_gpu_lost",
        "gpumon_gpu_utilization_ratio",
        "gpumon_gpu_memory_used_bytes",
        "gpumon_gpu_memory_total_bytes",
        "gpumon_gpu_power_watts",
        "gpumon_gpu_power_limit_watts",
        "gpumon_gpu_processes",
        "gpumon_gpu_sm_active_ratio",
        "gpumon_gpu_sm_occupancy_ratio",
        "gpumon_gpu_tensor_active_ratio",
        "gpumon_gpu_job_info",
    )

    def collect(self) -> list[Metric]:
        st = self.state
        info = InfoMetricFamily("gpumon_gpu", "Each GPU as discovered at start-up.", labels=GPU)
        lost = GaugeMetricFamily(
            "gpumon_gpu_lost", "1 when NVML reports the GPU fell off the bus.", labels=GPU
        )
        util = GaugeMetricFamily(
            "gpumon_gpu_utilization_ratio",
            "Share of the driver's last sample period in which a kernel ran (utilization.gpu).",
            labels=GPU,
        )
        used = GaugeMetricFamily(
            "gpumon_gpu_memory_used_bytes", "GPU memory used (memory.used).", labels=GPU
        )
        total = GaugeMetricFamily(
            "gpumon_gpu_memory_total_bytes", "GPU memory installed (memory.total).", labels=GPU
        )
        power = GaugeMetricFamily("gpumon_gpu_power_watts", "Power draw (power.draw).", labels=GPU)
        limit = GaugeMetricFamily(
            "gpumon_gpu_power_limit_watts",
            "Enforced power limit (enforced.power.limit).",
            labels=GPU,
        )
        procs = GaugeMetricFamily(
            "gpumon_gpu_processes", "Processes holding a compute context on the GPU.", labels=GPU
        )
        sm_active = GaugeMetricFamily(
            "gpumon_gpu_sm_active_ratio",
            "Share of SMs with a warp resident over the last tick (GPM, Hopper and later; "
            "DCGM_FI_PROF_SM_ACTIVE): low while utilisation reads 100 % is a GPU waiting.",
            labels=GPU,
        )
        sm_occupancy = GaugeMetricFamily(
            "gpumon_gpu_sm_occupancy_ratio",
            "Resident warps over the SMs' maximum, over the last tick (GPM).",
            labels=GPU,
        )
        tensor = GaugeMetricFamily(
            "gpumon_gpu_tensor_active_ratio",
            "Share of cycles the tensor cores were busy, over the last tick (GPM).",
            labels=GPU,
        )
        jobinfo = InfoMetricFamily(
            "gpumon_gpu_job",
            "The jobs using each GPU (Slurm job id; Kubernetes pod, namespace, container; "
            "every job's kind, name, user and command).",
            labels=[*GPU, *JOB],
        )
        hostname = self.inputs.hostname
        for idx in sorted(st.gpus):
            rt = st.gpus[idx]
            ident = rt.identity
            lv = [str(idx), ident.uuid]
            info.add_metric(
                lv,
                {
                    "name": ident.name or "",
                    "driver": st.driver_version or "",
                    "pci_bus_id": ident.pci_bus_id or "",
                    "hostname": hostname,
                },
            )
            s = rt.latest
            lost.add_metric(lv, 1.0 if s is not None and s.lost else 0.0)
            for lb in st.jobs_of(idx):
                jobinfo.add_metric([*lv, *lb.as_dict().values()], {})
            if s is None or s.lost:
                continue
            add(util, lv, None if s.util_pct is None else s.util_pct / 100.0)
            add(used, lv, s.mem_used_bytes)
            add(
                total,
                lv,
                s.mem_total_bytes if s.mem_total_bytes is not None else ident.mem_total_bytes,
            )
            add(power, lv, s.power_watts)
            add(
                limit,
                lv,
                s.power_limit_watts if s.power_limit_watts is not None else ident.power_limit_watts,
            )
            add(procs, lv, None if s.processes is None else len({p.pid for p in s.processes}))
            add(sm_active, lv, s.sm_active_ratio)
            add(sm_occupancy, lv, s.sm_occupancy_ratio)
            add(tensor, lv, s.tensor_active_ratio)
        return [
            *(info, lost, util, used, total, power, limit, procs),
            *(sm_active, sm_occupancy, tensor, jobinfo),
        ]
