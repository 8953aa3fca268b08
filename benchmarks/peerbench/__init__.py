"""The parts of the peers benchmark (``benchmarks/peers.py``) and of ``benchmarks/untuned.py``.

One job a module: the ops compared, their implementations, timing, the copy yardstick, output
checks, tables, the summary, the output files and the self-test; ``untuned_*`` are untuned.py's;
``gpu`` is every GPU script's one-line refusal on a machine without a GPU, ``labels`` the
configurations a script's ``--configs`` names.
benchmarks/ is not a package: the scripts put it on ``sys.path`` and import ``peerbench`` from
there. Everything that needs torch, CuPy or Triton imports it lazily, so ``--help``,
``--selftest`` and ``--plan`` run without them.
"""
