"""Random configs never crash the validator: they either validate or yield well-formed problems."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_ssp.config import EMBEDDED_DEFAULT, config_from_dict
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import INSTANCES, plan_deployment, validate_config

PATHS = st.sampled_from(
    [
        "/opt/models/Llama-2-70b-hf",
        "/opt/models/Llama-2-7b-hf",
        "/opt/models/Llama-2-13b-hf",
        "/opt/models/Meta-Llama-3-70B-Instruct",
        "/opt/models/Meta-Llama-3.1-8B",
        EMBEDDED_DEFAULT,
        "embedded:other",
        "/opt/models/unknown",
        "relative/dir",
        "",
    ]
) | st.text(max_size=20)
ARCHITECTURE_HINTS = st.none() | st.sampled_from(["llama-2-70b", "llama-3-8b", "llama-9"])
INSTANCE_TYPES = st.none() | st.sampled_from([*INSTANCES, "trn1.32xl", "p5.48xlarge"]) | st.text(max_size=12)
SMALL = st.integers(min_value=-2, max_value=80)


def model_section() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "path": PATHS,
            "dtype": st.sampled_from(["fp32", "bf16", "fp16", "fp8"]),
            "tp_degree": SMALL,
            "n_positions": st.integers(min_value=0, max_value=70000),
            "batch_size": st.integers(min_value=0, max_value=4),
            "first_core": SMALL,
        },
        optional={"architecture": ARCHITECTURE_HINTS},
    )


CONFIGS = st.fixed_dictionaries(
    {
        "platform": st.fixed_dictionaries(
            {
                "backend": st.sampled_from(["torch", "neuron", "tpu"]),
                "instance_type": INSTANCE_TYPES,
            }
        ),
        "target": model_section(),
        "speculation": st.fixed_dictionaries(
            {
                "k": st.integers(min_value=0, max_value=80),
                "drafter": st.sampled_from(["ngram", "model"]),
            }
        ),
        "generation": st.fixed_dictionaries(
            {
                "max_new_tokens": st.integers(min_value=0, max_value=5000),
                "max_prompt_tokens": st.none() | st.integers(min_value=0, max_value=70000),
            }
        ),
    },
    optional={"draft": model_section()},
)


# Neuron configs near the valid region, so the hardware rules and the plan get exercised in depth.
NEURON_MODEL = st.fixed_dictionaries(
    {
        "path": st.sampled_from(
            [
                "/opt/models/Llama-2-70b-hf",
                "/opt/models/Llama-2-7b-hf",
                "/opt/models/Llama-2-13b-hf",
                "/opt/models/Meta-Llama-3-8B",
            ]
        ),
        "dtype": st.sampled_from(["fp32", "bf16", "fp16"]),
        "tp_degree": st.sampled_from([1, 2, 4, 8, 12, 16, 24, 32, 64]),
        "n_positions": st.sampled_from([128, 2048, 8192, 65536]),
        "batch_size": st.sampled_from([1, 1, 1, 2]),
        "first_core": st.sampled_from([0, 0, 0, 8, 16]),
    }
)
NEURON_CONFIGS = st.fixed_dictionaries(
    {
        "platform": st.fixed_dictionaries(
            {"backend": st.just("neuron"), "instance_type": st.sampled_from(list(INSTANCES))}
        ),
        "target": NEURON_MODEL,
        "draft": NEURON_MODEL,
        "speculation": st.fixed_dictionaries({"k": st.integers(2, 8), "drafter": st.sampled_from(["ngram", "model"])}),
    }
)


def _well_formed(problem: Problem) -> None:
    assert isinstance(problem, Problem)
    assert problem.field and problem.rule and problem.fix
    problem.to_dict()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS | NEURON_CONFIGS)
def test_random_configs_validate_or_produce_errors(data: dict[str, Any]) -> None:
    try:
        config = config_from_dict(data)
    except UsageError as exc:
        assert exc.problems
        for problem in exc.problems:
            _well_formed(problem)
        return
    report = validate_config(config)
    assert report.ok == (not report.errors)
    for problem in report.errors + report.warnings:
        _well_formed(problem)
    if config.platform.backend == "neuron" and report.ok:
        plan = plan_deployment(config)  # a valid Neuron config always has a plan, and it fits
        assert plan.fits
        assert plan.load_order[0] in ("target", "draft")


@settings(max_examples=150, deadline=None)
@given(CONFIGS, st.sampled_from(list(INSTANCES)))
def test_plan_never_crashes_on_any_instance(data: dict[str, Any], instance_type: str) -> None:
    try:
        config = config_from_dict(data)
        plan = plan_deployment(config, instance_type)
    except UsageError as exc:
        for problem in exc.problems:
            _well_formed(problem)
        return
    assert plan.busiest_core_bytes >= 0 and plan.usable_bytes_per_core > 0
    assert set(plan.load_order) == set(plan.models)
