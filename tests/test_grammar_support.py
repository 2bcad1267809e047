"""Where grammars cannot run (llguidance's wheel needs glibc >= 2.31; Amazon Linux 2 has 2.26) and which engines refuse
the controls: `doctor`, `validate` and the pipeline say so, and a grammar request is refused with the reason."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from grammar_support import REGEX, SCHEMA, TOKENIZER, compiler
from test_pipeline_generate_ids import tiny_pipeline

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.pipeline.controls import serving_notes
from neuron_ssp.speculation import grammar as grammar_module
from neuron_ssp.speculation.controls import Grammar, RequestControls


@pytest.fixture
def amazon_linux_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grammar_module.platform, "libc_ver", lambda: ("glibc", "2.26"))


def test_an_old_glibc_is_named_with_what_to_do(amazon_linux_2):
    problem = grammar_module.grammar_support_problem("response_format")
    assert problem is not None and problem.field == "response_format" and problem.value == "glibc 2.26"
    assert "glibc >= 2.31" in problem.rule and "Amazon Linux 2" in problem.rule
    assert "Ubuntu 22.04" in problem.fix


def test_a_grammar_request_on_an_old_glibc_is_refused_with_the_reason(amazon_linux_2):
    pipeline = tiny_pipeline()
    problems = pipeline.controls_problems(RequestControls(grammar=REGEX, min_p=0.1))
    assert [p.field for p in problems] == [REGEX.field]
    assert "glibc" in problems[0].rule
    assert pipeline.controls_problems(RequestControls(min_p=0.1)) == []  # the sampling controls still run


def test_doctor_and_validate_say_where_grammars_cannot_run(amazon_linux_2, tmp_path):
    report = json.loads(CliRunner().invoke(main, ["doctor", "--json"]).output)
    assert report["structured_output"]["usable"] is False and report["structured_output"]["glibc"] == "2.26"
    config = tmp_path / "c.yaml"
    config.write_text("speculation:\n  engine: native\n")
    out = CliRunner().invoke(main, ["validate", "--json", str(config)]).output
    assert any("glibc >= 2.31" in warning["rule"] for warning in json.loads(out)["warnings"])


def test_validate_says_which_engine_refuses_grammar_and_control_requests():
    fused = load_config(None).model_copy(deep=True)
    fused.speculation.engine = "fused"
    notes = serving_notes(fused)
    assert [n.field for n in notes] == ["speculation.engine"]
    assert "refused with a 400" in notes[0].rule and "engine: native" in notes[0].fix
    assert serving_notes(load_config(None)) == []


def test_a_grammar_that_does_not_compile_names_the_requests_field_and_the_error():
    grammars = compiler()
    for grammar, says in [
        (Grammar("regex", "(ab", "guided_regex"), "unclosed group"),
        (Grammar("json_schema", '{"type": "foo"}', "response_format"), "Invalid type"),
        (Grammar("choice", '["a", 3]', "structured_outputs.choice"), "list of strings"),
        (Grammar("lark", "start: foo", "structured_outputs.grammar"), "foo"),
    ]:
        problems = grammars.problems(grammar)
        assert [p.field for p in problems] == [grammar.field], grammar
        assert says in problems[0].rule


def test_a_second_request_with_the_same_schema_compiles_nothing():
    grammars = compiler()
    first = grammars.matcher(SCHEMA)
    assert grammars.compiles == 1
    second = grammars.matcher(Grammar(SCHEMA.kind, SCHEMA.source, "tools"))  # another field, the same grammar
    assert grammars.compiles == 1
    first.commit(first.forced())
    assert second.forced() == grammars.matcher(SCHEMA).forced()  # the copies do not share state
    assert first.valid_prefix(TOKENIZER.encode('{"')) == 0 and second.valid_prefix(TOKENIZER.encode('{"')) == 1


def test_choice_lists_match_their_strings_exactly():
    grammars = compiler()
    matcher = grammars.matcher(Grammar("choice", json.dumps(["ab", "c{b", "a b"]), "guided_choice"))
    for text in ("ab", "c{b", "a b"):
        ids = TOKENIZER.encode(text) + [TOKENIZER.eos_token_id]
        assert matcher.valid_prefix(ids) == len(ids), text
    assert matcher.valid_prefix(TOKENIZER.encode("abc")) < len(TOKENIZER.encode("abc"))


def test_plan_says_which_requests_a_fused_engine_refuses(tmp_path):
    config = tmp_path / "fused.yaml"
    config.write_text(
        "platform:\n  backend: neuron\n  instance_type: inf2.xlarge\nspeculation:\n  engine: fused\n"
        "target:\n  path: embedded:smollm2-135m-instruct\n"
    )
    out = CliRunner().invoke(main, ["plan", str(config)]).output
    assert "refused with a 400" in " ".join(out.split()), out


def test_a_bad_value_and_a_grammar_that_does_not_compile_are_listed_together(amazon_linux_2):
    problems = tiny_pipeline().controls_problems(RequestControls(grammar=REGEX, min_p=2.0))
    assert [p.field for p in problems] == ["min_p", REGEX.field]
