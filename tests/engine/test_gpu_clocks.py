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


def test_parse_samples_counts_the_throttle_reasons():
    # 0x4: software power cap; 0x8 / 0x20: HW slowdown / SW thermal; 0x1: idle (neither)
    text = ("1980, 500.0, 50, 0x0000000000000000\n1800, 690.0, 55, 0x0000000000000004\n"
            "1700, 695.0, 56, 0x000000000000000C\n1600, 650.0, 60, 0x0000000000000020\n"
            "1980, 100.0, 40, 0x0000000000000001\n")
    stats = parse_samples(text)
    assert stats.samples == 5
    assert stats.power_capped == 2 / 5 and stats.slowed == 2 / 5
    assert stats.describe().endswith(
        ", power-capped 40% of samples, thermal/HW slowdown 40% of samples")
    # a driver that reports no reasons: none counted, the rest read as before
    na = parse_samples("1980, 500.0, 50, [N/A]\n1900, 510.0, 51, [Not Supported]\n")
    assert na.samples == 2 and na.power_capped is None and na.slowed is None
    assert "capped" not in na.describe()
    never = parse_samples("1980, 500.0, 50, 0x0000000000000000\n")
    assert never.power_capped == 0.0 and "capped" not in never.describe()


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
    capped = DecodeTiming(**{**vars(sampled), "power_capped": 0.62})
    assert format_row(capped).endswith("  SM 1830 MHz (min 1755) 612 W power-capped 62%")


def test_query_drops_the_throttle_field_where_the_driver_refuses_it(tmp_path):
    from engine import gpu_clocks

    def fake(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
        path.chmod(0o755)
        return str(path)

    new = fake("smi-new", "print('1980, 80.0, 30, 0x0000000000000001')")
    old = fake("smi-old", "sys.exit(2 if any('throttle' in a for a in sys.argv) else 0)")
    assert gpu_clocks._query(new, "0") == gpu_clocks.QUERY
    assert gpu_clocks._query(old, "0") == "clocks.sm,power.draw,temperature.gpu"
    assert gpu_clocks._query(str(tmp_path / "missing"), "0") == \
        "clocks.sm,power.draw,temperature.gpu"
