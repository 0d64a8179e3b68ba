"""Text in and out for real models: ``tokenizer.json`` through ``tokenizers``, chat via Jinja.

The chat template is the model's own (``tokenizer_config.json``'s ``chat_template`` or a
``chat_template.jinja`` file), rendered the way Hugging Face renders it: a sandboxed Jinja
environment with trimmed blocks, ``raise_exception`` and ``tojson``; the rendered text is then
encoded without adding special tokens, since the template already wrote them. Stop token ids
come from ``generation_config.json``, ``config.json`` and the tokenizer's EOS token.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from engine.weights import read_json
from w12.errors import W12Error


def _read_json(path: Path) -> dict:
    return read_json(path, required=False)


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_ids(value) -> set[int]:
    if isinstance(value, int):
        return {value}
    return {v for v in value if isinstance(v, int)} if isinstance(value, list) else set()


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise W12Error(f"{path}: missing (text generation needs the model's tokenizer.json)")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as exc:
            raise W12Error("text generation needs the 'tokenizers' package "
                           "(pip install tokenizers)") from exc
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception types
            raise W12Error(f"{path}: cannot load ({' '.join(str(exc).split())})") from exc
        config = _read_json(folder / "tokenizer_config.json")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.chat_template = self._find_template(folder, config)
        self.stop_ids = self._find_stop_ids(folder)

    @staticmethod
    def _find_template(folder: Path, config: dict) -> str | None:
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = folder / "chat_template.jinja"
        if not template and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return template or None

    def _find_stop_ids(self, folder: Path) -> frozenset[int]:
        ids = _as_ids(_read_json(folder / "generation_config.json").get("eos_token_id"))
        ids |= _as_ids(_read_json(folder / "config.json").get("eos_token_id"))
        if self.eos_token is not None and self._tok.token_to_id(self.eos_token) is not None:
            ids.add(self._tok.token_to_id(self.eos_token))
        return frozenset(ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise W12Error("this tokenizer has no chat template; use a plain prompt")
        return _render(self.chat_template, messages=messages, bos_token=self.bos_token or "",
                       eos_token=self.eos_token or "", add_generation_prompt=add_generation_prompt)

    def encode_prompt(self, prompt: str, *, chat: bool, system: str | None = None) -> list[int]:
        """Token ids for ``prompt``: through the chat template when ``chat``, else as raw text."""
        if not chat:
            return self.encode(prompt)
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": prompt})
        return self.encode(self.render_chat(messages), add_special_tokens=False)


def _render(template: str, **variables) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, indent=None):
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(**variables)
    except TemplateError as exc:
        raise W12Error(f"chat template: {' '.join(str(exc).split())}") from exc


class TextStream:
    """Turns a growing token list into newly printable text.

    Never emits half a UTF-8 character, and keeps the last ``holdback`` characters back so that
    a stop string split across tokens is never printed before it is recognised.
    """

    def __init__(self, tokenizer: Tokenizer, *, holdback: int = 0) -> None:
        self.tokenizer, self.holdback, self.printed = tokenizer, holdback, 0

    def push(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            return ""
        return self._emit(text[: max(len(text) - self.holdback, self.printed)])

    def finish(self, final_text: str) -> str:
        return self._emit(final_text)

    def _emit(self, text: str) -> str:
        new, self.printed = text[self.printed:], max(len(text), self.printed)
        return new
