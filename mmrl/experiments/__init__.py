"""Experiment tools built on the core: ``mmrl sweep`` (variants side by side over seeds), ``mmrl
extrapolate`` (RELEX) and ``mmrl plot`` (reward curves)."""
