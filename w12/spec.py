"""Constants of the W12 format, version 1.

A BF16 value has bits ``s | e(8) | m(7)``. Per output row ``n`` a base exponent ``e0[n]`` picks
a window of 16 binades ``[e0, e0 + 15]``; an in-window element is stored as the 12-bit record
``r = s << 11 | (e - e0) << 7 | m`` split into a *hi* byte (``r >> 4``) and a *lo* nibble
(``m & 15``, two per byte, even column in the low nibble). Everything else is an escape: its
record is 0 and its exact 16 bits sit in the row's sparse escape list. FORMAT.md is the full
specification; this module holds the numbers that code on every device shares.
"""

FORMAT_NAME = "w12"
FORMAT_VERSION = 1

WINDOW_BINADES = 16
E0_MIN = 1  # exponent 0 holds zeros and subnormals: always escapes
E0_MAX = 255 - WINDOW_BINADES  # 239: the window never reaches exponent 255 (inf/NaN)

# Canonical in-memory dtypes of the escape list (the container may store narrower ones).
ROWPTR_DTYPE = "int64"
COL_DTYPE = "int32"
VAL_DTYPE = "int16"  # raw BF16 bits


def lo_width(k: int) -> int:
    """Bytes per row of the lo plane: two nibbles a byte, the last half-used for odd K."""
    return (k + 1) // 2


def narrow_uint_bits(max_value: int) -> int:
    """Bits of the narrowest unsigned integer (8/16/32/64) that holds ``max_value``."""
    for bits in (8, 16, 32, 64):
        if max_value < (1 << bits):
            return bits
    raise ValueError(f"value {max_value} does not fit in 64 bits")


def storage_nbytes(n: int, k: int, num_escapes: int) -> int:
    """Bytes a W12 tensor occupies on disk: planes, e0, and the escape list with its indices.

    Row pointers and column indices use the narrowest unsigned type that holds their largest
    value (FORMAT.md, "Escape list"), which keeps the per-row overhead low on small-K layers.
    """
    rowptr_bytes = (n + 1) * narrow_uint_bits(num_escapes) // 8
    col_bytes = num_escapes * narrow_uint_bits(max(k - 1, 0)) // 8
    return n * k + n * lo_width(k) + n + rowptr_bytes + col_bytes + 2 * num_escapes
