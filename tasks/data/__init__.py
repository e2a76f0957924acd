"""Bring-your-own-data tasks: ``data/rows-v0`` (rows of the user's files, scored by ``mmrl.verifiers``)
and ``data/mixture-v0`` (alias ``mixture``: registered tasks sampled with weights). See docs/data.md."""

from mmrl.core.registry import register_task, register_task_alias
from mmrl.tasks.data.loading import DataError
from mmrl.tasks.data.mixture import MixtureConfig, MixtureTask, SourceConfig, SourcedExample
from mmrl.tasks.data.task import RowExample, RowsConfig, RowsTask

register_task("data/rows-v0", RowsTask, RowsConfig)
register_task("data/mixture-v0", MixtureTask, MixtureConfig)
register_task_alias("mixture", "data/mixture-v0")

__all__ = ["DataError", "MixtureConfig", "MixtureTask", "RowExample", "RowsConfig", "RowsTask", "SourceConfig",
           "SourcedExample"]
