"""Model-based rewards: a sequence classifier (reward model) and a generative yes/no judge.

Both load a Hugging Face model from a local folder once (cached by folder, device and dtype, so several
components or rebuilt rewards share it), score in batches under ``torch.no_grad`` in eval mode, and are
deterministic. Loading happens when the reward is built, so a wrong folder is a spec error before training.

- ``classifier``: sigmoid of one logit of ``AutoModelForSequenceClassification`` on the prompt and the
  completion (the chat template's user / assistant turns when the tokenizer has one, else the text pair).
- ``judge``: a causal LM asked :data:`JUDGE_TEMPLATE`; the score is P(yes) / (P(yes) + P(no)) at the next
  token, i.e. sigmoid(logit(yes) − logit(no)), where yes / no each sum the single-token spellings
  ``yes``, `` yes``, ``Yes``, `` Yes`` the vocabulary has (likewise for no). The generative-verifier recipe
  of "Generative Verifiers" (arXiv 2408.15240).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch

from mmrl.verifiers.base import register_verifier
from mmrl.verifiers.text import MAX_CHARS, scalar_text

JUDGE_TEMPLATE = ("Question:\n{question}\n\nReference answer:\n{reference}\n\nResponse:\n{response}\n\n"
                  "Is the response correct? Answer yes or no.")
"""The judge's default question; ``{question}`` is the prompt, ``{reference}`` the answer column,
``{response}`` the completion (plain replacement: other braces need no escaping)."""
PLACEHOLDERS = ("{question}", "{reference}", "{response}")
Scorer = Callable[[list[Any], list[Any], list[Any]], list[float]]


def resolve_device(device: str) -> torch.device:
    """``"auto"``: CUDA when available, else CPU; anything else as torch reads it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer the folder declares. A declared generic fast tokenizer is loaded as such:
    ``AutoTokenizer`` would swap it for the model type's own class, which can add special tokens."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = folder / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def model_folder(model: str) -> Path:
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"model {model!r} is not a local model folder (no config.json there)")
    return folder.resolve()


@lru_cache(maxsize=8)
def load_model(kind: str, folder: Path, device: torch.device, dtype: str) -> tuple[Any, Any]:
    """(model in eval mode on ``device``, tokenizer) of a folder; cached."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    tokenizer = load_tokenizer(folder)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {folder} has neither a pad nor an EOS token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def as_text(value: object) -> str:
    """Model input text of a row value: strings (their last :data:`MAX_CHARS`), others as ""."""
    return value[-MAX_CHARS:] if isinstance(value, str) else ""


def reference_text(answer: object) -> str:
    """The judge's reference text: strings and numbers as text, other values as their ``repr``, None as ""."""
    if answer is None:
        return ""
    text = scalar_text(answer)
    if text is None:
        try:
            text = repr(answer)
        except ValueError:  # an integer too long to print, inside a container
            text = ""
    return text[:MAX_CHARS]


def check_batching(batch_size: int, max_length: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length < 8:
        raise ValueError(f"max_length must be >= 8 tokens, got {max_length}")


# ------------------------------------------------------------------------------------------------
# classifier


@register_verifier("classifier", uses_answer=False, batched=True)
def classifier(*, model: str, label: int | str | None = None, batch_size: int = 8, max_length: int = 1024,
               device: str = "cpu", dtype: Literal["float32", "bfloat16", "float16"] = "float32") -> Scorer:
    """A scorer: sigmoid of logit ``label`` (an index or a name of ``config.id2label``; None for a model
    with a single output) of the classifier in folder ``model`` on (prompt, completion)."""
    check_batching(batch_size, max_length)
    net, tokenizer = load_model("classifier", model_folder(model), resolve_device(device), dtype)
    index = label_index(net.config, label)
    chat = getattr(tokenizer, "chat_template", None) is not None

    def encode(prompts: list[str], completions: list[str]) -> dict[str, torch.Tensor]:
        if chat:
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                                   tokenize=False)
                     for p, c in zip(prompts, completions)]
            return tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                             add_special_tokens=False)  # the chat template wrote them
        return tokenizer(prompts, completions, padding=True, truncation="longest_first", max_length=max_length,
                         return_tensors="pt")

    def score(prompts: list[Any], completions: list[Any], answers: list[Any]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(completions), batch_size):
            batch = encode([as_text(p) for p in prompts[start:start + batch_size]],
                           [as_text(c) for c in completions[start:start + batch_size]])
            with torch.no_grad():
                logits = net(**{k: v.to(net.device) for k, v in batch.items()}).logits  # [B, labels]
            out += torch.sigmoid(logits[:, index].float()).tolist()
        return out

    return score


def label_index(config: Any, label: int | str | None) -> int:
    """Index of the scored logit; a spec error names the labels when ``label`` does not fit the model."""
    labels = {int(i): str(name) for i, name in (getattr(config, "id2label", None) or {}).items()}
    count = config.num_labels
    if label is None:
        if count != 1:
            raise ValueError(f"the classifier has {count} labels ({labels}); set label to one of them")
        return 0
    if isinstance(label, str):
        by_name = {name: i for i, name in labels.items()}
        if label not in by_name:
            raise ValueError(f"label {label!r} is not one of the classifier's labels {sorted(by_name)}")
        return by_name[label]
    if not 0 <= label < count:
        raise ValueError(f"label {label} is out of range for a classifier with {count} labels")
    return label


# ------------------------------------------------------------------------------------------------
# judge

YES_SPELLINGS = ("yes", " yes", "Yes", " Yes")
NO_SPELLINGS = ("no", " no", "No", " No")


def single_token_ids(tokenizer: Any, spellings: Sequence[str]) -> list[int]:
    """Ids of the spellings that are one token in this vocabulary (deduplicated, in order)."""
    ids: list[int] = []
    for spelling in spellings:
        encoded = tokenizer.encode(spelling, add_special_tokens=False)
        if len(encoded) == 1 and encoded[0] not in ids and encoded[0] != tokenizer.unk_token_id:
            ids.append(encoded[0])
    return ids


def fill_template(template: str, question: str, reference: str, response: str) -> str:
    return template.replace("{question}", question).replace("{reference}", reference).replace("{response}", response)


@register_verifier("judge", batched=True)
def judge(*, model: str, judge_template: str = JUDGE_TEMPLATE, batch_size: int = 8, max_length: int = 2048,
          device: str = "cpu", dtype: Literal["float32", "bfloat16", "float16"] = "float32") -> Scorer:
    """A scorer: P(yes) / (P(yes) + P(no)) of the causal LM in folder ``model`` at the token after
    ``judge_template`` (in the chat template's user turn when the tokenizer has one). Batched with left
    padding; positions follow the attention mask, so a row's score does not depend on its batch."""
    check_batching(batch_size, max_length)
    if "{response}" not in judge_template:
        raise ValueError("judge_template must contain {response} (and may contain {question}, {reference})")
    net, tokenizer = load_model("judge", model_folder(model), resolve_device(device), dtype)
    yes, no = single_token_ids(tokenizer, YES_SPELLINGS), single_token_ids(tokenizer, NO_SPELLINGS)
    if not yes or not no:
        raise ValueError(f"the judge's vocabulary has no single-token spelling of "
                         f"{'yes' if not yes else 'no'} (tried {YES_SPELLINGS if not yes else NO_SPELLINGS})")
    chat = getattr(tokenizer, "chat_template", None) is not None

    def prompt_text(question: str, reference: str, response: str) -> str:
        text = fill_template(judge_template, question, reference, response)
        if not chat:
            return text
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    def score(prompts: list[Any], completions: list[Any], answers: list[Any]) -> list[float]:
        texts = [prompt_text(as_text(p), reference_text(a), as_text(c))
                 for p, a, c in zip(prompts, answers, completions)]
        out: list[float] = []
        for start in range(0, len(texts), batch_size):
            out += yes_probability(net, tokenizer, texts[start:start + batch_size], yes, no, max_length,
                                   add_special_tokens=not chat)  # a chat template writes its own
        return out

    return score


def yes_probability(net: Any, tokenizer: Any, texts: list[str], yes: list[int], no: list[int],
                    max_length: int, add_special_tokens: bool) -> list[float]:
    """P(yes) / (P(yes) + P(no)) at the next token of each text (left-padded, left-truncated batch)."""
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"  # keep the question's end
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                      add_special_tokens=add_special_tokens)
    ids, mask = batch["input_ids"].to(net.device), batch["attention_mask"].to(net.device)  # [B, L]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]: left padding must not shift positions
    with torch.no_grad():
        logits = net(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()  # [B, V]
    log_yes = torch.logsumexp(logits[:, yes], dim=-1)  # [B]
    log_no = torch.logsumexp(logits[:, no], dim=-1)  # [B]
    return torch.sigmoid(log_yes - log_no).tolist()
