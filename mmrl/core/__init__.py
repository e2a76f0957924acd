"""The core: the contracts components meet through, and the one training loop that drives them.

Layers, each importing only the ones above it in this list (``docs/architecture.md``):

1. foundations: :mod:`~mmrl.core.registry`, :mod:`~mmrl.core.typed` (recipe values → dataclasses),
   :mod:`~mmrl.core.rollout`, :mod:`~mmrl.core.contracts`, :mod:`~mmrl.core.scored`, :mod:`~mmrl.core.paths`;
2. (outside the core) :mod:`mmrl.algos`: the pure tensor functions and the hook contracts;
3. run services: :mod:`~mmrl.core.config`, :mod:`~mmrl.core.engine`, :mod:`~mmrl.core.checkpoint`,
   :mod:`~mmrl.core.logging`, :mod:`~mmrl.core.evaluate`, :mod:`~mmrl.core.warm_start`;
4. :mod:`~mmrl.core.trainer`: collect → score → advantages → update → log → eval → checkpoint.
"""
