"""A tiny byte-level BPE tokenizer (16 tokens) built in the test, a small finite language over it, and an oracle of
that language written without llguidance: what the constrained-speculation tests compare the loop against."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from neuron_ssp.speculation.controls import Grammar
from neuron_ssp.speculation.grammar import GrammarCompiler

CHARS = list('abc{}":,12') + ["\u0120"]  # byte-level BPE spells a space as U+0120 (Ġ)
MERGES = [("a", "b"), ("b", "a"), ("b", "c"), ("{", '"')]
# (ab|ba|c)(ab|c)?: nine strings, several tokenizations each (ab, a+b, ...); the mask after a token depends on it
LANGUAGE = ["ab", "ba", "c", "abab", "abc", "baab", "bac", "cab", "cc"]
REGEX = Grammar("regex", "(ab|ba|c)(ab|c)?", "structured_outputs.regex")
SCHEMA = Grammar(
    "json_schema",
    '{"type": "object", "properties": {"ab": {"type": "integer"}}, "required": ["ab"], "additionalProperties": false}',
    "response_format",
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {char: i for i, char in enumerate(CHARS)}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    vocab["<eos>"] = len(vocab)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")


TOKENIZER = tiny_tokenizer()
VOCAB = len(TOKENIZER)
EOS = TOKENIZER.eos_token_id
TEXT = [TOKENIZER.convert_tokens_to_string([token]) for token in TOKENIZER.convert_ids_to_tokens(list(range(VOCAB)))]


def compiler() -> GrammarCompiler:
    return GrammarCompiler(TOKENIZER, {EOS}, VOCAB)


def oracle_allowed(text: str) -> torch.Tensor:
    """(VOCAB,) bool: the tokens that keep `text` a prefix of a LANGUAGE string; EOS where `text` is one."""
    allowed = torch.tensor(
        [token != EOS and any(s.startswith(text + TEXT[token]) for s in LANGUAGE) for token in range(VOCAB)]
    )
    allowed[EOS] = text in LANGUAGE
    return allowed


def exact_outputs(table: torch.Tensor, prompt: torch.Tensor, new: int) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every output of constrained plain sampling at temperature 1 from a table LM (logits from the last two tokens)
    after `prompt`, up to `new` tokens, with its probability: the distribution the loop must reproduce."""

    def walk(tokens: tuple[int, ...], text: str, probability: float) -> Iterator[tuple[tuple[int, ...], float]]:
        if len(tokens) == new or (tokens and tokens[-1] == EOS):
            yield tokens, probability
            return
        context = list(prompt.tolist()) + list(tokens)
        logits = table[context[-2], context[-1]].masked_fill(~oracle_allowed(text), float("-inf"))
        for token, p in enumerate(logits.double().softmax(-1).tolist()):
            if p > 0:
                yield from walk(tokens + (token,), text + TEXT[token] if token != EOS else text, probability * p)

    yield from walk((), "", 1.0)
