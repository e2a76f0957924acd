"""Tiny model folders for the model-based rewards, built here from configs (random weights) and a
word-level tokenizer: a BERT sequence classifier (one logit; two labels bad / good) and a Qwen2 causal LM
judge (with and without a chat template)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

WORDS = ("what is two plus two ? the answer four five is : yes no Yes No question reference response correct "
         "Is Answer or . , \n user assistant").split(" ")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} . {% endfor %}"
                 "{% if add_generation_prompt %}assistant : {% endif %}")


def word_tokenizer(special: dict[str, str], drop: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over :data:`WORDS` (minus ``drop``), special tokens first."""
    vocab = {token: i for i, token in enumerate([*special.values(), *(w for w in dict.fromkeys(WORDS) if w not in drop)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if "cls_token" in special:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


@pytest.fixture(scope="session")
def classifier_dirs(tmp_path_factory):
    """Two tiny BERT classifiers: one logit, and two labels named bad / good."""
    tokenizer = word_tokenizer({"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"})
    folders = {}
    for name, labels in (("single", {0: "LABEL_0"}), ("pair", {0: "bad", 1: "good"})):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=128, num_labels=len(labels),
                            id2label=labels, label2id={v: k for k, v in labels.items()}, pad_token_id=0)
        folder = tmp_path_factory.mktemp(f"classifier_{name}")
        BertForSequenceClassification(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[name] = str(folder)
    return folders


@pytest.fixture(scope="session")
def judge_dirs(tmp_path_factory):
    """A tiny Qwen2 causal LM, saved twice: with a chat template and without."""
    tokenizer = word_tokenizer({"pad_token": "<pad>", "eos_token": "<eos>", "unk_token": "<unk>"})
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1)
    model = Qwen2ForCausalLM(config)
    folders = {}
    for name, template in (("plain", None), ("chat", CHAT_TEMPLATE)):
        folder = tmp_path_factory.mktemp(f"judge_{name}")
        model.save_pretrained(folder)
        tokenizer.chat_template = template
        tokenizer.save_pretrained(folder)
        folders[name] = str(folder)
    return folders




@pytest.fixture(scope="session")
def word_tokenizer_factory():
    return word_tokenizer
