"""A small trained byte-level BPE tokenizer (GPT-2's, Llama-3's and SmolLM2's kind), built in a few milliseconds:
real tokenization work (about 0.7 s per MB of text) and a real `tokenizer.json` description."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 20,
    "def speculative(draft, target, k):\n        return accept(draft, target)\n" * 20,
    "################################################################ " * 5,
]


def byte_level_tokenizer(**backend_parts) -> PreTrainedTokenizerFast:
    """A small trained byte-level BPE (GPT-2's, Llama-3's and SmolLM2's kind), with `backend_parts` set on it."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet))
    for name, part in backend_parts.items():
        setattr(backend, name, part)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
