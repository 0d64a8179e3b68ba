"""Text generation as one typed call: load a model, apply the chat template, decode, stop.

``generate_text`` is what ``w12 generate`` runs; ``complete`` does the same on an already
loaded model and tokenizer so tests and benchmarks reuse one load. Stop strings cut the text at
their first occurrence; stop token ids (EOS) end a row and are not part of its text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.generate import Engine, generate
from engine.sampling import Sampling
from engine.speculative import make_drafter, speculative_generate
from engine.tokenizer import TextStream, Tokenizer
from engine.weights import SYNTHETIC_PREFIX, LoadedModel, load_model, open_source
from w12.errors import W12Error


@dataclass(frozen=True)
class GenerateOptions:
    mode: str | None = None  # "bf16" / "w12"; None: W12 for a W12 folder, else BF16
    chat: bool | None = None  # None: use the chat template when the tokenizer has one
    system: str | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    max_seq_len: int | None = None  # None: just enough for the longest prompt
    device: str = "cpu"
    compile: bool = False
    drafter: str | None = None  # speculative decoding: "ngram", "early-exit:K", "demo", a folder
    budget: int = 16  # nodes per verify step (root included)
    tree: bool = True  # best-first tree, or the drafter's chain
    head: str = "exact"  # "int8": the certified INT8 LM head (engine.head)


def generate_text(
    spec: str, prompts: list[str], options: GenerateOptions = GenerateOptions(),
    on_text: Callable[[int, str], None] | None = None,
) -> list[str]:
    """Load ``spec`` (a folder) and complete every prompt; ``on_text(row, text)`` streams."""
    if str(spec).startswith(SYNTHETIC_PREFIX):
        raise W12Error(f"{spec}: synthetic models have no tokenizer; time them with bench decode")
    source, _, _ = open_source(spec)
    tokenizer = Tokenizer(source.folder)
    loaded = load_model(spec, mode=options.mode, device=options.device)
    return complete(loaded, tokenizer, prompts, options, on_text=on_text)


def complete(
    loaded: LoadedModel, tokenizer: Tokenizer, prompts: list[str], options: GenerateOptions,
    on_text: Callable[[int, str], None] | None = None,
) -> list[str]:
    chat = tokenizer.chat_template is not None if options.chat is None else options.chat
    ids = [tokenizer.encode_prompt(p, chat=chat, system=options.system) for p in prompts]
    room = options.budget if options.drafter else 0
    seq_len = options.max_seq_len or max(map(len, ids)) + options.max_new_tokens + room
    engine = Engine(loaded.model, batch=len(ids), max_seq_len=seq_len, compile=options.compile,
                    head=options.head)
    holdback = max(map(len, options.stop), default=1) - 1
    streams = [TextStream(tokenizer, holdback=holdback) for _ in ids]
    so_far: list[list[int]] = [[] for _ in ids]

    def stop_check(row: int, tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens)
        return any(s in text for s in options.stop)

    def on_token(row: int, token: int) -> None:
        so_far[row].append(token)
        ended = token in tokenizer.stop_ids or (options.stop and stop_check(row, so_far[row]))
        if on_text is not None and not ended:  # the final flush prints the text up to the stop
            on_text(row, streams[row].push(so_far[row]))

    sampling = Sampling(options.temperature, options.top_p, options.seed)
    if options.drafter:
        drafter = make_drafter(options.drafter, loaded.model)
        outputs, _ = speculative_generate(
            engine, drafter, ids, max_new_tokens=options.max_new_tokens, budget=options.budget,
            tree=options.tree, sampling=sampling, stop_ids=tokenizer.stop_ids,
            stop_check=stop_check if options.stop else None, on_token=on_token)
    else:
        outputs = generate(
            engine, ids, max_new_tokens=options.max_new_tokens, sampling=sampling,
            stop_ids=tokenizer.stop_ids, stop_check=stop_check if options.stop else None,
            on_token=on_token,
        )
    texts = [cut_at_stop(tokenizer.decode(out), options.stop) for out in outputs]
    if on_text is not None:
        for row, text in enumerate(texts):
            on_text(row, streams[row].finish(text))
    return texts


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    cuts = [text.index(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
