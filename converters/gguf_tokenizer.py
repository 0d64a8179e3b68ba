"""Hugging Face tokenizer files from the vocabulary stored in a GGUF file.

llama.cpp keeps a GPT-2 style byte-level BPE tokenizer as three arrays: the tokens (already in
the byte-to-unicode alphabet, ``Ġ`` for a space), the merges (``"a b"`` strings in rank order) and
a type per token (1 normal, 3 control, 4 user-defined, 6 byte). That is exactly the content of a
``tokenizer.json`` BPE model, which is written here as plain JSON so that no tokenizer library is
needed. The pre-tokenizer is chosen from ``tokenizer.ggml.pre``: llama.cpp names the splitting
regexes it uses, and the known names map onto the equivalent ``tokenizers`` components.
Control tokens become special added tokens; the chat template and the special tokens go into
``tokenizer_config.json``. SentencePiece vocabularies (``tokenizer.ggml.model == "llama"``) are
not rebuilt: the caller is told and writes the model without a tokenizer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger("w12")

# role in tokenizer_config.json -> GGUF metadata key (under "tokenizer.ggml.")
SPECIAL_TOKEN_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                      "pad": "padding_token_id"}
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
# GPT-4 style splitting used by Llama 3 ("llama-bpe"): the regex does the work, ByteLevel only maps
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names whose regexes are "each digit alone" then the GPT-2 regex
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")


def pre_tokenizer(pre: str | None) -> dict:
    """The ``tokenizers`` pre-tokenizer equivalent to llama.cpp's pre-tokenizer named ``pre``."""
    if pre in _DIGITS_THEN_GPT2:
        digits = {"type": "Digits", "individual_digits": True}
        return {"type": "Sequence", "pretokenizers": [digits, _BYTE_LEVEL]}
    if pre == "llama-bpe":
        split = {"type": "Split", "pattern": {"Regex": _LLAMA3_SPLIT}, "behavior": "Isolated",
                 "invert": False}
        return {"type": "Sequence", "pretokenizers": [split, {**_BYTE_LEVEL, "use_regex": False}]}
    if pre not in (None, "default", "gpt2"):
        logger.warning("tokenizer pre-type %r is not known here; using GPT-2 splitting", pre)
    return dict(_BYTE_LEVEL)


def tokenizer_json(*, tokens: list[str], token_types: list[int], merges: list[str],
                   pre: str | None, bos_id: int | None, add_bos: bool) -> dict:
    """The ``tokenizer.json`` document of a byte-level BPE vocabulary."""
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind == TOKEN_CONTROL}
        for i, (tok, kind) in enumerate(zip(tokens, token_types, strict=True))
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": {tok: i for i, tok in enumerate(tokens)},
             "merges": list(merges)}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": pre_tokenizer(pre),
            "post_processor": _post_processor(tokens, bos_id, add_bos),
            "decoder": {**_BYTE_LEVEL, "add_prefix_space": True}, "model": model}


def _post_processor(tokens: list[str], bos_id: int | None, add_bos: bool) -> dict:
    if not add_bos or bos_id is None:
        return {**_BYTE_LEVEL, "trim_offsets": False}
    bos = tokens[bos_id]
    first = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {"type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [first, {"Sequence": {"id": "A", "type_id": 0}}, first,
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def write_tokenizer_files(folder: Path, fields: dict, *, context_length: int | None) -> bool:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    Returns False (and writes nothing) for vocabularies that are not byte-level BPE.
    """
    kind = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if kind != "gpt2" or not tokens:
        logger.warning("tokenizer model %r is not a byte-level BPE; no tokenizer files written",
                       kind)
        return False
    token_types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    bos_id = fields.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
    document = tokenizer_json(tokens=tokens, token_types=token_types,
                              merges=fields.get("tokenizer.ggml.merges") or [],
                              pre=fields.get("tokenizer.ggml.pre"), bos_id=bos_id, add_bos=add_bos)
    _write_json(folder / "tokenizer.json", document, indent=None)
    special = _special_tokens(fields, tokens, token_types)
    config = {"add_bos_token": add_bos,
              "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
              "add_prefix_space": bool(fields.get("tokenizer.ggml.add_space_prefix", False)),
              "clean_up_tokenization_spaces": False,
              "model_max_length": context_length or 2048,
              "tokenizer_class": "PreTrainedTokenizerFast", **special}
    template = fields.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special)
    return True


def _special_tokens(fields: dict, tokens: list[str], token_types: list[int]) -> dict:
    special = {}
    for role, key in SPECIAL_TOKEN_KEYS.items():
        token_id = fields.get(f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= token_id < len(tokens):
            special[f"{role}_token"] = tokens[token_id]
    named = set(special.values())
    extra = [tok for tok, kind in zip(tokens, token_types, strict=True)
             if kind == TOKEN_CONTROL and tok not in named]
    if extra:
        special["additional_special_tokens"] = extra
    return special


def _write_json(path: Path, document: dict, indent: int | None = 2) -> None:
    text = json.dumps(document, indent=indent, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
