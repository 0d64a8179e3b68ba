"""A stand-in SGLang entry for a test: start one worker the way SGLang does (``spawn``, with a
module-level target) and print whether W12 is registered inside that worker."""

from __future__ import annotations

import multiprocessing


def report(queue) -> None:
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    queue.put("w12" in QUANTIZATION_METHODS)


def main() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    worker = context.Process(target=report, args=(results,))
    worker.start()
    print(f"worker registered w12: {results.get(timeout=240)}")
    worker.join()
