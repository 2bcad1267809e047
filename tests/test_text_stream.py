"""Incremental detokenizing (pipeline/text.py) and the server's stop strings on top of it (serve/text.py).

A byte-level BPE tokenizer is trained here in milliseconds (multi-byte characters split across tokens,
special tokens); the embedded SmolLM2 tokenizer checks real text (slow: it needs the converted model).
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from neuron_ssp.pipeline.text import IncrementalDecoder, TextStream
from neuron_ssp.serve.text import TokenText

TEXT = ("Le café coûte 3 €, señor; 東京 は 晴れ 🌤️ today. Über naïve façades: «ça va» — ok! " * 3).strip()


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["hello world, the cat sat on the mat"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")


class CountingDecode:
    """Records how many ids each decode call is given."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sizes: list[int] = []

    def decode(self, ids, skip_special_tokens=False):
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def deltas(tokenizer, ids: list[int]) -> list[str]:
    decoder = IncrementalDecoder(tokenizer)
    return [decoder.add(i) for i in ids]


def test_deltas_join_to_the_full_decoding_and_multi_byte_characters_arrive_whole(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    pieces = deltas(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    assert not any("\ufffd" in p for p in pieces)
    assert pieces.count("") > 10  # bytes of an unfinished character waited for the token that completes it


def test_each_token_decodes_a_short_window_not_the_whole_sequence(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    counting = CountingDecode(tokenizer)
    deltas(counting, ids)
    assert len(ids) > 200 and max(counting.sizes) <= 8  # the longest character is 4 bytes: a few tokens


def test_special_tokens_add_no_text(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer("the cat")["input_ids"] + [eos] + tokenizer(" sat")["input_ids"] + [eos]
    pieces = deltas(tokenizer, ids)
    assert "".join(pieces) == "the cat sat" and pieces[-1] == ""


def test_text_stream_hands_over_only_non_empty_text(tokenizer):
    out: list[str] = []
    stream = TextStream(tokenizer, out.append)
    ids = tokenizer("€€ ok")["input_ids"]
    for i in ids:
        stream([i])
    assert "".join(out) == "€€ ok" and "" not in out


@pytest.mark.parametrize("stop", ["€, s", "ça", "o", "晴"])
def test_a_stop_string_across_token_boundaries_is_cut_and_never_sent(tokenizer, stop):
    ids = tokenizer(TEXT)["input_ids"]
    text = TokenText(tokenizer, [stop])
    sent = []
    for i in ids:
        text.add(i, "target")
        sent += [p.text for p in text.take()]
        if text.stopped:
            break
    sent += [p.text for p in text.take(final=True)]
    expected = TEXT[: TEXT.index(stop)]
    assert "".join(sent) == text.text == expected
    counted = text.returned_tokens  # the tokens that carry returned text: the last one reaches into it
    assert len(tokenizer.decode(ids[: counted - 1])) < len(expected) <= len(tokenizer.decode(ids[:counted]))


@pytest.mark.slow
def test_equal_to_full_decoding_on_real_text_with_the_embedded_tokenizer(use_embedded_cache):
    from transformers import AutoTokenizer

    from neuron_ssp.embedded.models import resolve_model_path

    real = AutoTokenizer.from_pretrained(str(resolve_model_path("embedded:smollm2-135m-instruct", "target.path")))
    prose = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "Il porte le nom de l'ingénieur Gustave Eiffel. 東京タワーは赤い。 Emoji: 🗼🇫🇷, maths: ∑ x² ≤ π.\n"
        "def f(x):\n    return {'a': [1, 2]}  # code, too\n"
    )
    ids = real(prose)["input_ids"] + [real.eos_token_id]
    assert "".join(deltas(real, ids)) == real.decode(ids, skip_special_tokens=True)
    chat = real.apply_chat_template([{"role": "user", "content": prose}], tokenize=False)
    chat_ids = real(chat, add_special_tokens=False)["input_ids"]
    assert "".join(deltas(real, chat_ids)) == real.decode(chat_ids, skip_special_tokens=True)
