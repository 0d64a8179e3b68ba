"""The ``w12`` command line: the top of the import graph, above every package of the project.

One module per command group, each command parsing its options with click, calling one typed
function of a package and printing what it returns:

* ``format``: ``convert``, ``verify``, ``inspect``, ``decode``, ``demo`` (``converters``,
  ``w12.stats``)
* ``generate``: ``generate`` (``engine.api``; ``--drafter``: speculative decoding)
* ``bench``: ``bench decode`` (``engine.bench``), ``bench spec`` (``engine.speculative.bench``)
* ``spec``: ``spec check`` (``engine.speculative.api``)
* ``draft``: ``draft train`` (``engine.speculative.train_drafter``)
* ``tune``: ``tune explain``, ``tune forcing``, ``tune prove`` (``spec_tuning.explain``,
  ``spec_tuning.prove``)
* ``serve``: ``serve`` (``sglang_integration.serve``)

``main`` (the ``w12`` console script, also ``python -m w12_cli``) imports a command's module
only when the command is named, and each command imports its package only when it runs, so
``w12 --help`` loads no engine, tuner or SGLang code. No package imports this one (the layers
contract in ``pyproject.toml``).
"""

from w12_cli.main import main

__all__ = ["main"]
