"""The clock sampling of the decode benchmark (engine.gpu_clocks), on the CPU: the parsing of
``nvidia-smi`` output, the sampler's process handling, and its absence where nothing can be
sampled."""

from __future__ import annotations

import sys

import torch

from engine.bench import DecodeTiming, format_row
from engine.gpu_clocks import ClockSampler, ClockStats, parse_samples


def test_parse_samples_skips_what_is_not_a_reading():
    text = "1980, 650.50, 61\n1755, [N/A], 63\n[N/A], 700.00, 64\nnot a line\n"
    stats = parse_samples(text)
    assert stats == ClockStats(samples=2, sm_mhz_mean=(1980 + 1755) / 2, sm_mhz_min=1755,
                               power_w_mean=650.5, power_w_max=650.5, temp_c_max=63)
    assert stats.describe() == "SM 1868 MHz (min 1755), 650 W (max 650), 63 C max"
    assert parse_samples("") is None
    assert parse_samples("[N/A], [N/A], [N/A]\n") is None
    no_power = parse_samples("1500, [Not Supported], [N/A]\n")
    assert no_power.power_w_mean is None and no_power.temp_c_max is None
    assert no_power.describe() == "SM 1500 MHz (min 1500)"


def test_sampler_reads_what_its_command_printed():
    script = "print('1980, 600.0, 50'); print('1900, 640.0, 52')"
    sampler = ClockSampler(torch.device("cpu"), command=[sys.executable, "-c", script])
    with sampler:
        sampler._proc.wait()  # (the fake sampler ends by itself; nvidia-smi runs until stopped)
    assert sampler.stats == ClockStats(samples=2, sm_mhz_mean=1940.0, sm_mhz_min=1900.0,
                                       power_w_mean=620.0, power_w_max=640.0, temp_c_max=52.0)
    assert sampler._proc is None


def test_sampler_keeps_every_sample_of_a_long_run():
    # more output than a pipe holds (a sampler writing into a pipe nobody reads would stall)
    script = "import sys\nfor i in range(20000): sys.stdout.write('1800, 500.0, 40\\n')"
    sampler = ClockSampler(torch.device("cpu"), command=[sys.executable, "-c", script])
    with sampler:
        sampler._proc.wait()
    assert sampler.stats.samples == 20000 and sampler.stats.sm_mhz_min == 1800.0


def test_sampler_gives_nothing_where_nothing_can_sample():
    with ClockSampler(torch.device("cpu")) as cpu:
        pass
    assert cpu.stats is None
    with ClockSampler(torch.device("cpu"), command=["/nonexistent/nvidia-smi"]) as missing:
        pass
    assert missing.stats is None


def test_format_row_names_the_clock_when_sampled():
    row = DecodeTiming(model="m", mode="w12", batch=32, steps=10, seconds=0.1, ms_per_step=10.0,
                       tokens_per_s=3200.0, weight_bytes=100, streamed_bytes=100,
                       weight_gbps=1.0, gpu_weight_bytes=None, kv_bytes_per_token=10,
                       cuda_graph=True, compiled=True)
    assert "MHz" not in format_row(row)
    sampled = DecodeTiming(**{**vars(row), "sm_mhz_mean": 1830.4, "sm_mhz_min": 1755.0,
                              "power_w_mean": 612.0})
    assert format_row(sampled).endswith("  SM 1830 MHz (min 1755) 612 W")
