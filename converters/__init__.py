"""Checkpoint sources and sinks for W12: Hugging Face folders and hub ids, GGUF files, demo models.

``converters.hf`` turns a BF16 (or cast) safetensors folder into a W12 folder, ``converters.gguf``
a llama.cpp GGUF file into a BF16 Hugging Face folder, ``converters.export`` a W12 folder back into
BF16, and ``converters.verify`` checks a W12 folder bit for bit against its source.
``converters.api`` is what the ``w12`` CLI calls. Every converter writes into a temporary folder
and renames it into place (``converters.atomic``). Nothing here is imported by ``w12`` itself.
"""
