"""The published CurveBench question, and one row of a local copy of the published dataset."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from mmrl.core.contracts import IMAGE_PLACEHOLDER
from mmrl.tasks.curvebench.trees import Parents

USER_PROMPT = "Construct the region-adjacency tree for this image of non-crossing closed curves."


class CurveQuestion:
    """The published question about an example's one image (mixed into both example kinds)."""

    @property
    def prompt(self) -> str:
        return f"{IMAGE_PLACEHOLDER}{USER_PROMPT}"


@dataclass(frozen=True)
class LoadedExample(CurveQuestion):
    """One row of a local copy of the published dataset (``local.py``)."""

    category: str
    name: str
    parents: Parents
    image: Image.Image
    system: str | None = None

    @property
    def images(self) -> tuple[Image.Image, ...]:
        return (self.image,)
