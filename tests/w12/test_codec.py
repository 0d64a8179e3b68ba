"""Bit-exactness of the W12 codecs: every BF16 bit pattern, awkward shapes, and property tests.

Both fast codecs (numba on the CPU, torch on any device) are compared with each other, with the
loop-based reference, and with the source bits. Equality of bit patterns, never closeness.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import w12
from w12 import codec_cpu, codec_torch, reference, spec

FIELDS = ("hi", "lo", "e0", "esc_rowptr", "esc_col", "esc_val")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def bf16_from_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits, np.uint16).view(np.int16)).view(
        torch.bfloat16
    )


def bits_of(t: torch.Tensor) -> np.ndarray:
    return t.cpu().view(torch.int16).numpy().view(np.uint16)


def assert_same_planes(a: w12.W12Tensor, b: w12.W12Tensor) -> None:
    for field in FIELDS:
        x, y = getattr(a, field).cpu(), getattr(b, field).cpu()
        assert x.dtype == y.dtype, field
        assert torch.equal(x, y), f"{field} differs"


def check_round_trip(t: torch.Tensor) -> w12.W12Tensor:
    """Encode with both codecs, require identical planes and an exact decode by both."""
    w_cpu = codec_cpu.encode(t.cpu().contiguous())
    w_torch = codec_torch.encode(t.contiguous())
    assert_same_planes(w_cpu, w_torch)
    w_cpu.validate("t")
    expected = bits_of(t)
    for w in (w_cpu, w_torch, w_torch.to("cpu")):
        assert np.array_equal(bits_of(w.decode()), expected)
        assert np.array_equal(bits_of(codec_torch.decode(w)), expected)
    return w_cpu


ALL_PATTERNS = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def test_every_bf16_pattern_against_every_window():
    """Row b holds 32 background values of exponent b, then all 65,536 patterns rolled by b.

    The patterns alone fill every window equally, so the background decides e0 (the lowest window
    containing b) and every pattern meets every possible window, at even and odd columns.
    """
    rng = np.random.default_rng(0)
    rows = []
    for b in range(1, 255):
        background = (b << 7) | rng.integers(0, 128, 32)
        rows.append(np.concatenate([background, np.roll(ALL_PATTERNS, b)]).astype(np.uint16))
    bits = np.stack(rows)
    w = check_round_trip(bf16_from_bits(bits))
    expected_e0 = [min(max(1, b - 15), spec.E0_MAX) for b in range(1, 255)]
    assert w.e0.tolist() == expected_e0


@pytest.mark.parametrize("shape", [(65536, 1), (1, 65536), (256, 256), (128, 512), (512, 128)])
def test_every_pattern_in_each_layout(shape):
    check_round_trip(bf16_from_bits(ALL_PATTERNS.reshape(shape)))


@pytest.mark.parametrize("shape", [(257, 255), (3, 65537)])
def test_every_pattern_at_odd_strides(shape):
    """Odd K: each pattern lands in both nibbles of the lo byte and in the half-used last byte."""
    n, k = shape
    bits = np.resize(ALL_PATTERNS, n * k).reshape(n, k)
    check_round_trip(bf16_from_bits(bits))


def test_planes_match_reference_encoder():
    rng = np.random.default_rng(1)
    bits = bits_of((torch.randn(7, 33) * 3e-3).bfloat16())
    bits[0, :4] = [0x0000, 0x8000, 0x7F80, 0xFFC1]  # +0, -0, +inf, a NaN with payload
    bits[1] = rng.integers(0, 65536, 33)  # spans far more than 16 binades
    bits[2] = 0  # all zeros: no counted value, e0 = 1
    t = bf16_from_bits(bits)
    ref = reference.encode(bits)
    got = codec_cpu.encode(t)
    for field, expected in zip(FIELDS, ref, strict=True):
        assert np.array_equal(getattr(got, field).numpy(), expected), field
    assert np.array_equal(reference.decode(*ref), bits)
    assert int(got.e0[2]) == 1 and got.num_escapes >= 33


@pytest.mark.parametrize(
    "fill", [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0e38]
)
def test_rows_full_of_specials(fill):
    t = torch.full((3, 9), fill).bfloat16()
    w = check_round_trip(t)
    in_window = fill not in (0.0, float("inf"), float("-inf")) and fill == fill and fill > 1e-38
    assert w.num_escapes == (0 if in_window else 27)


def test_window_tie_takes_lowest_e0():
    # one value in each of binades 100 and 120: windows starting 85..100 hold one, 105..120 hold
    # one, none holds both, so the lowest window holding one value starts at 85
    bits = np.array([[100 << 7, 120 << 7]], np.uint16)
    w = check_round_trip(bf16_from_bits(bits))
    assert int(w.e0[0]) == 85
    assert w.num_escapes == 1 and int(w.esc_col[0]) == 1


def test_exponent_254_and_1_edges():
    bits = np.array([[254 << 7 | 5, 1 << 7 | 3, 0x7F7F, 0x0080]], np.uint16)
    w = check_round_trip(bf16_from_bits(bits))
    assert int(w.e0[0]) == spec.E0_MIN  # the two exponent-1 values win over the two 254s


def test_bits_per_weight_of_gaussian_layer():
    t = (torch.randn(1024, 4096, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    w = check_round_trip(t)
    assert w.bits_per_weight <= 12.02
    n, k = w.shape
    assert w.nbytes == spec.storage_nbytes(n, k, w.num_escapes)


def test_encode_rejects_bad_input():
    with pytest.raises(w12.W12Error, match="bfloat16"):
        w12.encode(torch.zeros(2, 2))
    with pytest.raises(w12.W12Error, match="2-D"):
        w12.encode(torch.zeros(2, 2, 2, dtype=torch.bfloat16))
    with pytest.raises(w12.W12Error, match="torch.Tensor"):
        w12.encode(np.zeros((2, 2), np.uint16))


def test_non_contiguous_input_is_encoded_by_value():
    t = torch.randn(16, 10).bfloat16()
    w = w12.encode(t.t())
    assert torch.equal(w.decode().view(torch.int16), t.t().contiguous().view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_public_api_on_device(device):
    t = (torch.randn(33, 129) * 0.05).bfloat16().to(device)
    t[0, 0] = 0
    w = w12.encode(t)
    assert w.device.type == device
    assert torch.equal(w.decode().view(torch.int16), t.view(torch.int16))


def test_validate_catches_broken_planes():
    w = w12.encode(torch.randn(4, 6).bfloat16())
    bad = w12.W12Tensor(w.hi, w.lo[:, :1], w.e0, w.esc_rowptr, w.esc_col, w.esc_val)
    with pytest.raises(w12.W12Error, match="lo has shape"):
        bad.validate("layer.weight")
    bad = w12.W12Tensor(w.hi, w.lo, torch.zeros_like(w.e0), w.esc_rowptr, w.esc_col, w.esc_val)
    with pytest.raises(w12.W12Error, match="base exponent"):
        bad.validate("layer.weight")


def test_validate_enforces_canonical_escapes():
    t = torch.linspace(0.5, 1.5, 21).reshape(3, 7).bfloat16()
    t[1, 2] = 0
    w = w12.encode(t)
    in_window = t[1, 3].view(torch.int16).reshape(1)  # a value of the escape's own row
    moved = w12.W12Tensor(w.hi, w.lo, w.e0, w.esc_rowptr, w.esc_col, in_window)
    with pytest.raises(w12.W12Error, match="inside its row's window"):
        moved.validate("layer.weight")
    hi = w.hi.clone()
    hi[1, 2] = 5
    with pytest.raises(w12.W12Error, match="record"):
        w12.W12Tensor(hi, w.lo, w.e0, w.esc_rowptr, w.esc_col, w.esc_val).validate("w")
    lo = w.lo.clone()
    lo[0, -1] |= 0x10  # K = 7: the last byte's high nibble is unused
    with pytest.raises(w12.W12Error, match="unused high nibble"):
        w12.W12Tensor(w.hi, lo, w.e0, w.esc_rowptr, w.esc_col, w.esc_val).validate("w")


def _distributions(draw_scale, n, k, kind, rng):
    if kind == "normal":
        x = rng.standard_normal((n, k)) * draw_scale
        return torch.from_numpy(x).bfloat16()
    if kind == "bits":
        return bf16_from_bits(rng.integers(0, 65536, (n, k)))
    x = rng.standard_normal((n, k)) * draw_scale
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-42, 1e38])
    mask = rng.random((n, k)) < 0.2
    x[mask] = rng.choice(specials, mask.sum())
    return torch.from_numpy(x).bfloat16()


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 12),
    k=st.integers(1, 300),
    log_scale=st.floats(-40, 38),
    kind=st.sampled_from(["normal", "bits", "mixed"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_property(n, k, log_scale, kind, seed):
    rng = np.random.default_rng(seed)
    t = _distributions(10.0**log_scale, n, k, kind, rng)
    w = check_round_trip(t)
    ref = reference.encode(bits_of(t))
    assert np.array_equal(w.e0.numpy(), ref[2])
    assert np.array_equal(w.esc_col.numpy(), ref[4])
