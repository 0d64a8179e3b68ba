"""W12 checkpoints in SGLang, without patching SGLang.

``plugin.register`` adds the ``w12`` quantization method (``method``) to SGLang's registry and
to its ``--quantization`` choices; SGLang calls it through the ``sglang.srt.plugins`` entry
point in every process it starts. ``serve.serve`` (``w12 serve``) registers first and then runs
SGLang's server or ``bench_one_batch``, for entry points that load no plugins. ``shard`` cuts a
tensor-parallel rank's block out of the W12 planes. SGLang is imported only by ``method``,
``plugin`` and ``launch``, never by importing this package.

Built and tested against SGLang 0.5.21 only (``plugin.SGLANG_VERSION``): the layer and loader
internals the plugin relies on change between SGLang releases (0.5.22 reworked how layers learn
their tensor-parallel rank), so ``register`` refuses other releases instead of guessing.
"""
