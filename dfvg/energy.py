"""Energy and device-activity meters around one piece of work: NVIDIA GPUs via NVML, the CPU via RAPL.

Owns: reading NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since driver load) or,
on GPUs without it, integrating sampled board power; sampling GPU memory, utilization and clocks while the
work runs (for `resource_utilization.log`); reading RAPL package counters
(`/sys/class/powercap/intel-rapl:N/energy_uj`, wrap-around handled); and, where RAPL is not readable, an
`assumed` CPU figure: this process's CPU seconds x an assumed power per busy core, with that number's
source. Every result says which of these it is.

Does not own: FPGA energy (modeled by `dfvg.fpga.board.latency` from the board's assumed power), reports.

Caveats the sources repeat: NVML and RAPL count the whole device or socket, including other processes;
the assumed CPU power is a data-sheet share, not a measurement.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")
# AMD EPYC 7763: 280 W TDP over 64 cores. A per-core share of TDP is an upper-end figure for a busy core.
DEFAULT_WATTS_PER_CORE = 280.0 / 64
DEFAULT_WATTS_SOURCE = "assumed 4.375 W per busy core = AMD EPYC 7763 TDP 280 W / 64 cores (data sheet)"


@dataclass(frozen=True)
class Measurement:
    """Energy one component used during the metered work; energy_j None when it cannot be known."""

    component: str  # "gpu:0", "cpu"
    energy_j: float | None
    seconds: float
    provenance: str  # "measured" or "assumed"
    source: str


@dataclass
class GpuSample:
    t: float
    index: int
    memory_used_b: float
    utilization_pct: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    power_w: float


@dataclass
class Nvml:
    """NVML handles, or the reason there are none ('no NVIDIA GPU on this machine')."""

    handles: list = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    reason: str = ""

    @classmethod
    def open(cls) -> Nvml:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as err:  # NVMLError_LibraryNotFound / DriverNotLoaded / ImportError
            return cls(reason=f"no NVIDIA GPU on this machine (NVML: {type(err).__name__})")
        if not handles:
            return cls(reason="no NVIDIA GPU on this machine (NVML found 0 devices)")
        names = [_text(pynvml.nvmlDeviceGetName(h)) for h in handles]
        return cls(handles=handles, names=names)

    def total_energy_mj(self, index: int) -> float | None:
        import pynvml

        try:
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handles[index]))
        except pynvml.NVMLError:  # pre-Volta GPUs: not supported
            return None

    def sample(self, index: int) -> GpuSample:
        import pynvml

        h = self.handles[index]
        return GpuSample(
            t=time.perf_counter(), index=index,
            memory_used_b=float(pynvml.nvmlDeviceGetMemoryInfo(h).used),
            utilization_pct=float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
            sm_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            mem_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            power_w=pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def rapl_domains(root: Path = RAPL_ROOT) -> list[Path]:
    """Readable top-level RAPL package domains (intel-rapl:0, intel-rapl:1, ...; AMD uses the same names)."""
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if re.fullmatch(r"intel-rapl:\d+", path.name) and (path / "energy_uj").is_file():
            try:
                int((path / "energy_uj").read_text())
            except (OSError, ValueError):  # root-only since CVE-2020-8694 on most distributions
                continue
            found.append(path)
    return found


def rapl_delta_j(domain: Path, start_uj: int, end_uj: int) -> float:
    """Joules between two counter reads, undoing one wrap-around at max_energy_range_uj."""
    delta = end_uj - start_uj
    if delta < 0:
        delta += int((domain / "max_energy_range_uj").read_text())
    return delta / 1e6


class EnergyMeter:
    """`with EnergyMeter() as meter: work()` then `meter.measurements()` and `meter.gpu_samples`."""

    def __init__(self, nvml: Nvml | None = None, cpu_watts_per_core: float | None = None,
                 sample_interval_s: float = 0.1, rapl_root: Path = RAPL_ROOT):
        self.nvml = nvml if nvml is not None else Nvml.open()
        self.watts_per_core = cpu_watts_per_core
        self.interval = sample_interval_s
        self.rapl = rapl_domains(rapl_root)
        self.gpu_samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EnergyMeter:
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        self._rapl0 = [int((d / "energy_uj").read_text()) for d in self.rapl]
        self._gpu0 = [self.nvml.total_energy_mj(i) for i in range(len(self.nvml.handles))]
        if self.nvml.handles:
            self._thread = threading.Thread(target=self._sample_loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._t1, self._cpu1 = time.perf_counter(), time.process_time()
        self._rapl1 = [int((d / "energy_uj").read_text()) for d in self.rapl]
        self._gpu1 = [self.nvml.total_energy_mj(i) for i in range(len(self.nvml.handles))]
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample_loop(self) -> None:
        while True:
            for i in range(len(self.nvml.handles)):
                self.gpu_samples.append(self.nvml.sample(i))
            if self._stop.wait(self.interval):
                return

    @property
    def seconds(self) -> float:
        return self._t1 - self._t0

    def measurements(self) -> list[Measurement]:
        """One Measurement per GPU (or one saying there is none) and one for the CPU."""
        return [*self._gpu_measurements(), self._cpu_measurement()]

    def _gpu_measurements(self) -> list[Measurement]:
        if not self.nvml.handles:
            return [Measurement("gpu", None, self.seconds, "measured", self.nvml.reason)]
        out = []
        for i, name in enumerate(self.nvml.names):
            if self._gpu0[i] is not None and self._gpu1[i] is not None:
                energy = (self._gpu1[i] - self._gpu0[i]) / 1000.0
                src = f"NVML nvmlDeviceGetTotalEnergyConsumption delta on {name} (whole board, all processes)"
            else:
                energy = integrate_power([s for s in self.gpu_samples if s.index == i])
                src = f"NVML power samples every {self.interval}s integrated on {name} (no energy counter)"
            out.append(Measurement(f"gpu:{i}", energy, self.seconds, "measured", src))
        return out

    def _cpu_measurement(self) -> Measurement:
        if self.rapl:
            energy = sum(rapl_delta_j(d, a, b) for d, a, b in zip(self.rapl, self._rapl0, self._rapl1, strict=True))
            names = ", ".join(d.name for d in self.rapl)
            return Measurement("cpu", energy, self.seconds, "measured",
                               f"RAPL package counters {names} (whole socket, all processes)")
        watts = self.watts_per_core or DEFAULT_WATTS_PER_CORE
        source = DEFAULT_WATTS_SOURCE if self.watts_per_core is None else \
            f"assumed {watts} W per busy core (config cpu_watts_per_core)"
        cpu_s = self._cpu1 - self._cpu0
        return Measurement("cpu", watts * cpu_s, self.seconds, "assumed",
                           f"RAPL not readable here; {source} x this process's CPU-seconds "
                           "(measured with time.process_time)")


def integrate_power(samples: list[GpuSample]) -> float | None:
    """Trapezoidal integral of sampled power (W) over time (s) -> J; None with fewer than two samples."""
    if len(samples) < 2:
        return None
    return sum((b.t - a.t) * (a.power_w + b.power_w) / 2 for a, b in zip(samples, samples[1:], strict=False))
