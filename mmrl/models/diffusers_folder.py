"""Pipeline folders in the diffusers layout: a ``model_index.json`` and one subfolder per component,
each loadable with its own ``from_pretrained`` (our tiny pretrained pipelines and trained runs), and
Stable Diffusion 3 folders."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Any

from diffusers import AutoencoderKL

REQUIRED_COMPONENTS = ("unet", "scheduler", "text_encoder", "tokenizer")
SD3_REQUIRED_COMPONENTS = ("transformer", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                           "vae")



def _component_class(library: str, name: str) -> type:
    if library not in ("diffusers", "transformers"):
        raise ValueError(f"component library {library!r} is not supported (diffusers or transformers)")
    return getattr(importlib.import_module(library), name)


def is_sd3_folder(folder: Path) -> bool:
    index_file = folder / "model_index.json"
    return index_file.is_file() and "transformer" in json.loads(index_file.read_text())


def load_sd3_pipeline(folder: Path) -> Any:
    """A local Stable Diffusion 3 / 3.5 folder as diffusers' ``StableDiffusion3Pipeline`` (its
    components, prompt encoding and config, loaded unchanged; the T5 encoder may be absent), every
    component in float32: the policy computes in float32 (bf16 through the trainer's autocast), while
    transformers 5 would load the text encoders in the checkpoint's dtype (bf16 / fp16 in the published
    SD3.5 folders) beside a float32 transformer, and sampling would fail at the first step on the
    mismatched pooled prompt embedding."""
    import torch
    from diffusers import StableDiffusion3Pipeline

    index = json.loads((folder / "model_index.json").read_text())
    missing = [c for c in SD3_REQUIRED_COMPONENTS
               if not (isinstance(index.get(c), list) and index[c][0] and (folder / c).is_dir())]
    if missing:
        raise FileNotFoundError(f"SD3 pipeline folder {folder} lacks the components {missing} (model_index.json "
                                f"entries and sub-folders {list(SD3_REQUIRED_COMPONENTS)} are required)")
    # diffusers loads no folder whose T5 is missing (absent or ``[null, null]`` in model_index.json) unless told.
    absent = {name: None for name in ("text_encoder_3", "tokenizer_3")
              if not (isinstance(index.get(name), list) and index[name][0] and (folder / name).is_dir())}
    return StableDiffusion3Pipeline.from_pretrained(folder, torch_dtype=torch.float32, **absent)


def load_pipeline_components(folder: Path) -> tuple[Any, Any, Any, Any, AutoencoderKL | None]:
    """(unet, scheduler, text_encoder, tokenizer, vae or None) from a diffusers pipeline folder."""
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise FileNotFoundError(f"{folder} is not a diffusers pipeline folder (no model_index.json); build one "
                                f"with `mmrl pretrain-imagegen assets/imagegen/ddim_tiny.json --out DIR`")
    index = json.loads(index_file.read_text())
    missing = [c for c in REQUIRED_COMPONENTS
               if not (isinstance(index.get(c), list) and index[c][0] and (folder / c).is_dir())]
    if missing:
        raise FileNotFoundError(f"pipeline folder {folder} lacks the components {missing} (model_index.json "
                                f"entries and sub-folders {list(REQUIRED_COMPONENTS)} are required)")
    loaded = {}
    for name in (*REQUIRED_COMPONENTS, "vae"):
        if name == "vae" and not (isinstance(index.get("vae"), list) and index["vae"][0] and (folder / "vae").is_dir()):
            loaded[name] = None
            continue
        library, class_name = index[name]
        cls = _component_class(library, class_name)
        loaded[name] = (cls.from_pretrained(folder / name, subfolder=None) if name == "scheduler"
                        else cls.from_pretrained(folder / name))
    return loaded["unet"], loaded["scheduler"], loaded["text_encoder"], loaded["tokenizer"], loaded["vae"]


def save_pipeline(out: Path, unet: Any, scheduler: Any, text_encoder: Any, tokenizer: Any,
                  vae: AutoencoderKL | None) -> None:
    """Write a diffusers-layout folder: every component loads with its own ``from_pretrained``."""
    index: dict[str, Any] = {"_class_name": "DiffusionPipeline", "_diffusers_version": _diffusers_version()}
    for name, component in (("unet", unet), ("scheduler", scheduler), ("text_encoder", text_encoder),
                            ("tokenizer", tokenizer), ("vae", vae)):
        if component is None:
            continue
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        component.save_pretrained(target)
        library = "diffusers" if type(component).__module__.startswith("diffusers") else "transformers"
        index[name] = [library, type(component).__name__]
    (out / "model_index.json").write_text(json.dumps(index, indent=1))


def _diffusers_version() -> str:
    import diffusers

    return diffusers.__version__
