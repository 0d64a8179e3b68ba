"""W12: a lossless 12-bit storage format for BF16 weights.

``encode`` turns a 2-D BF16 tensor into a :class:`W12Tensor`; ``W12Tensor.decode`` gives the
exact tensor back. ``w12.container`` reads and writes W12 checkpoint folders (FORMAT.md).
"""

from w12.errors import W12Error
from w12.spec import FORMAT_VERSION
from w12.tensor import W12Tensor, encode

__all__ = ["FORMAT_VERSION", "W12Error", "W12Tensor", "encode"]
__version__ = "0.1.0"
