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

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import torch

QUERY = "clocks.sm,power.draw,temperature.gpu"


@dataclass(frozen=True)
class ClockStats:
    samples: int
    sm_mhz_mean: float
    sm_mhz_min: float
    power_w_mean: float | None  # None where the driver reports no power reading
    power_w_max: float | None
    temp_c_max: float | None

    def describe(self) -> str:
        text = f"SM {self.sm_mhz_mean:.0f} MHz (min {self.sm_mhz_min:.0f})"
        if self.power_w_mean is not None:
            text += f", {self.power_w_mean:.0f} W (max {self.power_w_max:.0f})"
        if self.temp_c_max is not None:
            text += f", {self.temp_c_max:.0f} C max"
        return text


def _number(field: str) -> float | None:
    try:
        return float(field.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_samples(text: str) -> ClockStats | None:
    """``ClockStats`` of ``nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu
    --format=csv,noheader,nounits`` output (one "MHz, W, C" line per sample); lines without an
    SM clock are skipped; None without any sample."""
    clocks, power, temp = [], [], []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) != 3:
            continue
        sm = _number(fields[0])
        if sm is None:
            continue
        clocks.append(sm)
        if (w := _number(fields[1])) is not None:
            power.append(w)
        if (c := _number(fields[2])) is not None:
            temp.append(c)
    if not clocks:
        return None
    return ClockStats(
        samples=len(clocks), sm_mhz_mean=sum(clocks) / len(clocks), sm_mhz_min=min(clocks),
        power_w_mean=sum(power) / len(power) if power else None,
        power_w_max=max(power) if power else None, temp_c_max=max(temp) if temp else None)


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
        return [smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                "-i", smi_target(self.device), "-lms", str(self.interval_ms)]

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
