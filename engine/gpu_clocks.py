"""The GPU's SM clock, power draw and temperature, sampled by ``nvidia-smi`` while a timed loop
runs, so that a timing can say whether the chip held its clock (a sustained run that draws more
power may run at a lower clock than a short one).

    with ClockSampler(torch.device("cuda")) as clocks:
        run_the_loop()
    print(clocks.stats)  # None where nothing could be sampled (no nvidia-smi, a CPU device)

Sampling costs the GPU nothing (a separate process reads the driver's counters every
``interval_ms``); where ``nvidia-smi`` is missing or fails, ``stats`` stays None and the timing
is unaffected.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import torch

# (the throttle field under its older name, which newer drivers still accept as an alias of
# clocks_event_reasons.active; a field the driver does not know would fail the whole query)
QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
# bits of that field (NVML's clock event reasons)
SW_POWER_CAP = 0x4
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW thermal, HW thermal, HW power brake


@dataclass(frozen=True)
class ClockStats:
    samples: int
    sm_mhz_mean: float
    sm_mhz_min: float
    power_w_mean: float | None  # None where the driver reports no power reading
    power_w_max: float | None
    temp_c_max: float | None
    # fractions of the samples whose clock the driver held down: by the software power cap,
    # and by a thermal or hardware slowdown (None where the driver reports no reasons)
    power_capped: float | None = None
    slowed: float | None = None

    def describe(self) -> str:
        text = f"SM {self.sm_mhz_mean:.0f} MHz (min {self.sm_mhz_min:.0f})"
        if self.power_w_mean is not None:
            text += f", {self.power_w_mean:.0f} W (max {self.power_w_max:.0f})"
        if self.temp_c_max is not None:
            text += f", {self.temp_c_max:.0f} C max"
        if self.power_capped:
            text += f", power-capped {100 * self.power_capped:.0f}% of samples"
        if self.slowed:
            text += f", thermal/HW slowdown {100 * self.slowed:.0f}% of samples"
        return text


def _number(field: str) -> float | None:
    try:
        return float(field.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _reasons(field: str) -> int | None:
    try:
        return int(field.strip(), 16)  # "0x0000000000000004"
    except ValueError:
        return None


def parse_samples(text: str) -> ClockStats | None:
    """``ClockStats`` of ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` output
    (one "MHz, W, C, reasons" line per sample; lines of the first three alone are read too);
    lines without an SM clock are skipped; None without any sample."""
    clocks, power, temp, reasons = [], [], [], []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) not in (3, 4):
            continue
        sm = _number(fields[0])
        if sm is None:
            continue
        clocks.append(sm)
        if (w := _number(fields[1])) is not None:
            power.append(w)
        if (c := _number(fields[2])) is not None:
            temp.append(c)
        if len(fields) == 4 and (r := _reasons(fields[3])) is not None:
            reasons.append(r)
    if not clocks:
        return None
    return ClockStats(
        samples=len(clocks), sm_mhz_mean=sum(clocks) / len(clocks), sm_mhz_min=min(clocks),
        power_w_mean=sum(power) / len(power) if power else None,
        power_w_max=max(power) if power else None, temp_c_max=max(temp) if temp else None,
        power_capped=(sum(bool(r & SW_POWER_CAP) for r in reasons) / len(reasons)
                      if reasons else None),
        slowed=sum(bool(r & SLOWDOWN) for r in reasons) / len(reasons) if reasons else None)


def smi_target(device: torch.device) -> str:
    """The ``nvidia-smi -i`` value of a CUDA device: its PCI bus id where torch reports one
    (independent of ``CUDA_VISIBLE_DEVICES``), else the visible device's physical index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        return (f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:"
                f"{getattr(props, 'pci_device_id', 0):02X}.0")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if visible != [""] and index < len(visible) and visible[index].strip().isdigit():
        return visible[index].strip()
    return str(index)


@functools.cache
def _query(smi: str, target: str) -> str:
    """QUERY, or its first three fields where this driver refuses the throttle-reason field
    (one probe per process)."""
    try:
        probe = subprocess.run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                "-i", target], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        probe = None
    if probe is not None and probe.returncode == 0:
        return QUERY
    return QUERY.rsplit(",", 1)[0]


class ClockSampler:
    """Samples the clock of ``device`` between ``__enter__`` and ``__exit__`` (``command``: the
    sampling command, for tests; default ``nvidia-smi ... -lms interval_ms`` on the device)."""

    def __init__(self, device: torch.device, interval_ms: int = 100,
                 command: list[str] | None = None):
        self.device = device
        self.interval_ms = interval_ms
        self.command = command
        self.stats: ClockStats | None = None
        self._proc: subprocess.Popen | None = None
        self._out = None  # the samples go to a file: no pipe to fill on a long run

    def _command(self) -> list[str] | None:
        if self.command is not None:
            return self.command
        if self.device.type != "cuda":
            return None
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        target = smi_target(self.device)
        return [smi, f"--query-gpu={_query(smi, target)}", "--format=csv,noheader,nounits",
                "-i", target, "-lms", str(self.interval_ms)]

    def __enter__(self) -> ClockSampler:
        command = self._command()
        if command is not None:
            self._out = tempfile.TemporaryFile(mode="w+")
            try:
                self._proc = subprocess.Popen(command, stdout=self._out,
                                              stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
                self._out.close()
                self._out = None
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._out.seek(0)
        self.stats = parse_samples(self._out.read())
        self._out.close()
        self._proc = self._out = None
