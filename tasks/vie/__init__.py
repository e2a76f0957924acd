"""Visual information extraction to JSON (arXiv 2506.13363): synthetic lab reports / invoices / forms
or a local folder of real documents, with a balanced field-level precision / recall reward."""

from mmrl.core.registry import register_task
from mmrl.tasks.vie.reward import extraction_reward, field_scores, normalise_key, normalise_value, parse_prediction
from mmrl.tasks.vie.task import VIEConfig, VIEExample, VIETask

register_task("vie/extract-v0", VIETask, VIEConfig)

__all__ = ["VIEConfig", "VIEExample", "VIETask", "extraction_reward", "field_scores", "normalise_key",
           "normalise_value", "parse_prediction"]
