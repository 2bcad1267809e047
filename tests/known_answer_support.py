"""Tiny models with a real (character-level) HF tokenizer, for the known-answer tests."""

from __future__ import annotations

import torch
from conftest import TINY_VOCAB, tiny_llama
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from neuron_ssp.embedded.known_answer import REFERENCE_SENTENCE

SPECIALS = ["<unk>", "<s>", "</s>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, 97 ids in all (the tiny models' vocabulary)."""
    chars = [chr(c) for c in range(32, 32 + TINY_VOCAB - len(SPECIALS))]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def trained_tiny_llama(tokenizer: PreTrainedTokenizerFast, steps: int = 40) -> LlamaForCausalLM:
    """A tiny Llama that has learnt the reference sentence: what a working checkpoint looks like to the check."""
    model = tiny_llama(0).train()
    ids = torch.tensor([tokenizer(REFERENCE_SENTENCE, add_special_tokens=False)["input_ids"]])
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimiser.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimiser.step()
    return model.eval()


def greedy_ids(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, prompt: str, n: int) -> tuple[int, ...]:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return tuple(ids[-n:])
