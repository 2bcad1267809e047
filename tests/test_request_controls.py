"""The request controls' interface (speculation/controls.py) and what a pipeline says it cannot run of them."""

from __future__ import annotations

import pytest
from test_pipeline_generate_ids import PROMPT, tiny_pipeline

from neuron_ssp.config import load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.pipeline.build import engine_controls_problems
from neuron_ssp.speculation.controls import Grammar, RequestControls, value_problems


def test_the_defaults_ask_nothing():
    assert RequestControls().asked == []
    assert not RequestControls().changes_logits
    assert RequestControls(ignore_eos=True).asked == ["ignore_eos"]
    assert not RequestControls(ignore_eos=True, stop_token_ids=(3,)).changes_logits


def test_every_bad_value_is_named_at_once():
    controls = RequestControls(
        logit_bias=((5, 1.0), (99, 2.0), (-1, float("inf"))),
        min_tokens=-1,
        stop_token_ids=(100,),
        repetition_penalty=0.0,
        presence_penalty=3.0,
        frequency_penalty=float("nan"),
        min_p=1.5,
    )
    problems = value_problems(controls, vocab_size=64)
    assert [(p.field, p.value) for p in problems] == [
        ("logit_bias", [99, -1]),
        ("logit_bias", [float("inf")]),
        ("stop_token_ids", [100]),
        ("min_tokens", -1),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", problems[6].value),
        ("min_p", 1.5),
    ]
    assert all(p.rule and p.fix for p in problems)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"speculation.engine": "fused", "neuron.library": "nxdi"}, "NxD Inference's fused speculation"),
        ({"speculation.engine": "fused"}, "fused decoder samples on the device"),
        ({"speculation.engine": "library"}, "SpeculativeGenerator.sample"),
    ],
)
def test_engines_that_do_not_sample_on_the_host_refuse_every_control_naming_the_requests_field(overrides, says):
    config = load_config(None).model_copy(deep=True)
    config.speculation.engine = overrides["speculation.engine"]
    if "neuron.library" in overrides:
        config.neuron.library = overrides["neuron.library"]
    controls = RequestControls(grammar=Grammar("json_object", "", "response_format"), min_p=0.1)
    problems = engine_controls_problems(config, controls)
    assert [p.field for p in problems] == ["response_format", "min_p"]
    assert all(says in p.rule and "speculation.engine: native" in p.fix for p in problems)
    assert engine_controls_problems(config, RequestControls()) == []


def test_a_pipeline_lists_every_problem_and_a_request_with_them_is_refused():
    pipeline = tiny_pipeline()
    controls = RequestControls(min_p=2.0, stop_token_ids=(10_000,))
    assert [p.field for p in pipeline.controls_problems(controls)] == ["stop_token_ids", "min_p"]
    with pytest.raises(UsageError) as refused:
        pipeline.generate_ids(PROMPT, 4, controls=controls)
    assert "min_p" in str(refused.value) and "stop_token_ids" in str(refused.value)
    assert pipeline.controls_problems(RequestControls()) == []
    plain = pipeline.generate_ids(PROMPT, 4).tokens
    assert pipeline.generate_ids(PROMPT, 4, controls=RequestControls()).tokens == plain
