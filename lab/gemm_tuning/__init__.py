"""The pieces of ``lab/tune_gemm.py``: the table's one writer (``table_io``), the timing
helpers (``timing``) and one module per tuning step (``small``, ``large``, ``wgmma``,
``toggle``, ``power``)."""
