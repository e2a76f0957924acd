"""Task adapters (installed as ``mmrl.tasks``): procedural data, prompts and verifiable rewards.

Importing this package registers every built-in task.
"""

from mmrl.tasks import sanity  # noqa: F401
from mmrl.tasks import vlm_sanity  # noqa: F401
from mmrl.tasks import video  # noqa: F401
from mmrl.tasks import imagegen  # noqa: F401
from mmrl.tasks import robot  # noqa: F401
from mmrl.tasks import spatial_ssrl  # noqa: F401
from mmrl.tasks import curvebench  # noqa: F401
from mmrl.tasks import vie  # noqa: F401
from mmrl.tasks import driving  # noqa: F401
from mmrl.tasks import data  # noqa: F401
from mmrl.tasks import judge  # noqa: F401
from mmrl.tasks import pretext  # noqa: F401
