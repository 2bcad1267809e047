"""The fewest tokens a text can encode to (pipeline/prompt_length.py): never above the real count, tight on the
vocabulary's longest token, and withheld from tokenizers that can shorten a text before splitting it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from known_answer_support import char_tokenizer
from serve_support import CharTokenizer
from tokenizer_support import byte_level_tokenizer
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from neuron_ssp.errors import UsageError
from neuron_ssp.pipeline.prompt_length import PromptLimit, TokenReach, token_reach
from neuron_ssp.pipeline.prompts import encode_prompt

BYTES = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def bytes_only(missing: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE with one token per byte except the bytes of the characters in `missing` (SmolLM2 lacks six
    control characters' bytes this way): its tokenizer drops those bytes."""
    lost = {piece for c in missing for piece in BYTES.pre_tokenize_str(c)[0][0]}
    alphabet = [c for c in sorted(pre_tokenizers.ByteLevel.alphabet()) if c not in lost]
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


TEXTS = st.text(alphabet=st.sampled_from("ab #\n\t\x04\x06def fox ####é€😀\u0301"), max_size=400) | st.text(
    max_size=200
)


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_the_bound_never_exceeds_the_real_count(text):
    for tokenizer in (byte_level_tokenizer(), char_tokenizer(), bytes_only("\x04\x06")):
        reach = token_reach(tokenizer)
        assert reach is not None
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= reach.fewest_tokens(text)


def test_characters_the_tokenizer_drops_are_counted_out():
    tokenizer = bytes_only("\x04\x06")
    assert token_reach(tokenizer) == TokenReach(1, "\x04\x06")
    assert tokenizer("\x04" * 50 + "\x06" * 50, add_special_tokens=False)["input_ids"] == []
    assert TokenReach(1, "\x04\x06").fewest_tokens("\x04a\x06b") == 2


def test_the_bound_is_tight_on_the_longest_token():
    tokenizer = byte_level_tokenizer()
    reach = token_reach(tokenizer)
    token = max(tokenizer.get_vocab(), key=len)
    text = tokenizer.convert_tokens_to_string([token]) * 50
    assert len(text) == 50 * reach.longest  # an ASCII token: one character per byte
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == reach.fewest_tokens(text) == 50


@pytest.mark.parametrize(
    "tokenizer, why",
    [
        (byte_level_tokenizer(normalizer=normalizers.NFC()), "composition shortens e + U+0301 to é"),
        (byte_level_tokenizer(normalizer=normalizers.Strip()), "strips white space"),
        (byte_level_tokenizer(normalizer=normalizers.Replace("  ", " ")), "replaces by a shorter string"),
        (byte_level_tokenizer(pre_tokenizer=pre_tokenizers.WhitespaceSplit()), "drops white space"),
        (byte_level_tokenizer(model=models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")), "one [UNK] a word"),
        (byte_level_tokenizer(pre_tokenizer=None), "BPE skips a character it has no token for"),
        (byte_level_tokenizer(model=models.BPE({"a": 0, "u": 1}, [], unk_token="u", fuse_unk=True)), "fuses unknowns"),
        (bytes_only("\u0080"), "a missing continuation byte: a character may vanish whole"),
        (CharTokenizer(), "not a fast tokenizer: nothing to read"),
    ],
)
def test_no_bound_where_the_tokenizer_can_shorten_a_text(tokenizer, why):
    assert token_reach(tokenizer) is None, why


def test_a_special_token_that_strips_white_space_withholds_the_bound():
    tokenizer = byte_level_tokenizer()
    assert token_reach(tokenizer) is not None
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken("<x>", lstrip=True)]})
    assert token_reach(tokenizer) is None


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized():
    class Counting(PreTrainedTokenizerFast):
        seen: list[int] = []

        def __call__(self, text, **kwargs):
            self.seen.append(len(text))
            return super().__call__(text, **kwargs)

    tokenizer = Counting(tokenizer_object=byte_level_tokenizer().backend_tokenizer)
    longest = token_reach(tokenizer).longest
    limit = PromptLimit(100, token_reach(tokenizer))
    encode_prompt(tokenizer, "a" * (100 * longest), False, limit)  # 100 tokens at least: it may fit
    with pytest.raises(UsageError) as refused:
        encode_prompt(tokenizer, "a" * (100 * longest + 1), False, limit)
    assert tokenizer.seen == [100 * longest]
    problem = refused.value.problems[0]
    assert (problem.field, problem.value) == ("prompt", f"{100 * longest + 1} characters")
    assert "at least 101 tokens" in problem.rule and f"more than {longest} characters" in problem.rule
    assert "more than the 100 a prompt may have" in problem.rule and problem.fix == "shorten the prompt"


@pytest.mark.slow
def test_the_embedded_tokenizer_bound_holds_on_real_and_adversarial_text(use_embedded_cache):
    from transformers import AutoTokenizer

    from neuron_ssp.embedded.models import resolve_model_path

    real = AutoTokenizer.from_pretrained(str(resolve_model_path("embedded:smollm2-135m-instruct", "target.path")))
    reach = token_reach(real)
    assert reach == TokenReach(81, "\x04\x06\x13\x14\x16\x1d")
    longest = real.convert_tokens_to_string([max(real.get_vocab(), key=len)])
    texts = [
        "The Eiffel Tower is a wrought-iron lattice tower. 東京タワーは赤い。 🗼🇫🇷 ∑ x² ≤ π\n" * 40,
        longest * 30,  # the bound's tight case
        "\x04\x06" * 500 + "a",  # characters without a token: dropped, and counted out
        "".join(chr(c) for c in range(32, 0x3000)),
    ]
    for text in texts:
        assert len(real(text, add_special_tokens=False)["input_ids"]) >= reach.fewest_tokens(text)
    assert len(real(longest * 30, add_special_tokens=False)["input_ids"]) == reach.fewest_tokens(longest * 30)
