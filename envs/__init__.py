"""Gymnasium environments (installed as ``mmrl.envs``), registered as ``mmrl/<Name>-v<k>``.

Importing this package registers every built-in environment with gymnasium.
"""
