"""The reference decode engine: Llama / Qwen2 / Qwen3 dense decoders on BF16 or W12 weights.

``load_model(folder_or_preset, mode="bf16"|"w12")`` builds a model (``engine.weights``);
``Engine`` binds it to a static KV cache and, on a GPU, a CUDA-graph decode step
(``engine.generate``); ``generate`` / ``engine.api.generate_text`` decode tokens / text.
``engine.bench`` times W12 against BF16; ``engine.hf_interop`` puts W12 linears into a
``transformers`` model. Modules import ``transformers`` and ``tokenizers`` only where needed.
"""

from engine.generate import Engine, generate
from engine.model import ModelArgs, Transformer
from engine.sampling import Sampling
from engine.weights import load_model

__all__ = ["Engine", "ModelArgs", "Sampling", "Transformer", "generate", "load_model"]
