"""How many requests a server runs at once for a config (`serving_batch`), and what it says when serve.max_batch
asks for more than that: the one rule the server loads with and SageMaker autoscaling sizes instances by."""

from __future__ import annotations

import logging
from typing import Any

import deploy_fixtures
import pytest

from neuron_ssp.config import Config
from neuron_ssp.serve import capacity
from neuron_ssp.serve.capacity import serving_batch, serving_batch_of
from neuron_ssp.serve.server import log_serving_batch, serving

aws_sandbox = deploy_fixtures.aws_sandbox  # fake credentials, HTTP to loopback only


def config(
    backend: str = "neuron",
    engine: str = "native",
    library: str = "transformers-neuronx",
    batch_size: int = 1,
    **serve: Any,
) -> Config:
    data: dict[str, Any] = {
        "target": {"path": "/models/Llama-2-70b-hf", "batch_size": batch_size},
        "speculation": {"engine": engine},
        "serve": serve,
    }
    if backend == "neuron":
        data |= {"platform": {"backend": "neuron", "instance_type": "trn1.32xlarge"}, "neuron": {"library": library}}
    return Config.model_validate(data)


@pytest.mark.parametrize(
    ("backend", "engine", "library", "batch_size", "max_batch", "rows"),
    [
        ("torch", "native", "transformers-neuronx", 1, 8, 8),  # our loop: the KV cache holds serve.max_batch rows
        ("neuron", "native", "transformers-neuronx", 1, 8, 1),  # compiled for batch 1
        ("neuron", "native", "transformers-neuronx", 4, 8, 4),  # the compiled batch caps serve.max_batch
        ("neuron", "native", "transformers-neuronx", 4, 2, 2),  # serve.max_batch within the compiled batch
        ("neuron", "library", "transformers-neuronx", 4, 8, 4),  # SpeculativeGenerator.sample takes a batch
        ("neuron", "fused", "transformers-neuronx", 4, 8, 4),  # FusedSpeculativeDecoder.sample takes a batch
        ("neuron", "fused", "nxdi", 4, 8, 4),  # NxDI fused speculation batches in its graph
        ("neuron", "native", "nxdi", 4, 8, 1),  # NxDI draft-model speculation without fusion: batch 1
    ],
)
def test_serving_batch_per_backend_library_and_engine(
    backend: str, engine: str, library: str, batch_size: int, max_batch: int, rows: int
) -> None:
    assert serving_batch(config(backend, engine, library, batch_size, max_batch=max_batch)) == rows


def test_the_reason_says_whether_requests_join_a_running_batch() -> None:
    """From batch_rules' table: our loop lets rows join and leave; SpeculativeGenerator.sample takes its batch at
    the start, so a request that arrives meanwhile waits for the whole batch (the M/M/c figures then flatter it)."""
    assert "rows join and leave a running batch" in capacity.serving_batch_reason(config(batch_size=4))
    library = capacity.serving_batch_reason(config(engine="library", batch_size=4))
    assert "a request joins only between batches" in library


def test_max_batch_above_the_compiled_batch_names_the_field_the_rule_and_the_fix() -> None:
    problem = serving_batch_of(config(batch_size=4, max_batch=8)).problem
    assert problem is not None and problem.field == "serve.max_batch" and problem.value == 8
    assert "runs 4 request(s) at once" in problem.rule and "target.batch_size 4" in problem.rule
    assert "serve.max_batch: 4" in problem.fix
    assert serving_batch_of(config(batch_size=4, max_batch=4)).problem is None
    assert serving_batch_of(config("torch", max_batch=8)).problem is None
    one_at_a_time = serving_batch_of(config(engine="native", library="nxdi", batch_size=4)).problem
    assert one_at_a_time is not None and "engine native on nxdi serves one request at a time" in one_at_a_time.rule


def test_the_server_warns_where_max_batch_was_set_and_informs_where_it_is_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="neuron_ssp.serve")
    for settings in (
        config(batch_size=2, max_batch=8),  # set in the config: the user asked for 8
        config(batch_size=2),  # the default 8, the torch backend's
        config(batch_size=2, max_batch=2),  # nothing to say
    ):
        log_serving_batch(serving_batch_of(settings))
    (asked, default) = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert asked[0] == logging.WARNING and default[0] == logging.INFO
    assert asked[1].startswith("serve.max_batch = 8: the server runs 2 request(s) at once")


def test_a_server_reads_its_batch_once_with_its_address_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serving` reads the rule once, before the models load: the pipeline is loaded for its rows and the log line
    says its problem (issue 40 item 5: serve.py, server.py and the worker each computed it)."""
    calls = []

    def rule(config: Config) -> tuple[int, str]:
        calls.append(config)
        return 2, "target.batch_size 2 caps serve.max_batch 8"

    monkeypatch.setattr(capacity, "_serving_batch", rule)
    started = serving(config(batch_size=2, max_batch=8))
    assert len(calls) == 1
    assert started.batch.rows == 2 and started.batch.problem is not None
    assert (
        started.batch.problem.field == "serve.max_batch" and "runs 2 request(s) at once" in started.batch.problem.rule
    )
    assert started.listen.url == "http://127.0.0.1:8000" and started.api_key is None


def test_the_server_and_sagemaker_autoscaling_share_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Change the rule in its one place: the server's batch and an endpoint's capacity both follow."""
    from sagemaker_fixtures import INF2_CONFIG, endpoint_plan

    from neuron_ssp.deploy.sagemaker.queueing import SlotQueue

    monkeypatch.setattr(capacity, "_serving_batch", lambda _config: (3, "a rule changed in one place"))
    assert serving_batch(config()) == 3
    plan = endpoint_plan(INF2_CONFIG, min_instances=1, max_instances=2)
    assert plan.capacity.slots == 3 and "a rule changed in one place" in plan.capacity.reason
    tracking = plan.scaling.policy_request()["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == round(SlotQueue(3, 0.5).in_system, 1) == 1.7  # 1.5 + Erlang C 9/38
    tags = {t["Key"]: t["Value"] for t in plan.endpoint_request["Tags"]}
    assert tags["neuron-ssp:serving-batch"] == "3"
    lmi = endpoint_plan(INF2_CONFIG, engine="lmi", min_instances=1, max_instances=2)
    assert lmi.capacity.slots == 1  # LMI speculates one request at a time, whatever our rule says


@pytest.mark.parametrize("metric", ["concurrency", "invocations"])
def test_every_request_of_a_batched_endpoint_passes_the_service_models(
    monkeypatch: pytest.MonkeyPatch, metric: str
) -> None:
    """botocore's ParamValidator and the enums, patterns and maxima it skips (the serving-batch tag included)."""
    import boto3
    from sagemaker_fixtures import INF2_CONFIG, assert_valid_request, endpoint_plan

    monkeypatch.setattr(capacity, "_serving_batch", lambda _config: (4, "target.batch_size 4"))
    plan = endpoint_plan(INF2_CONFIG, min_instances=1, max_instances=3, scaling_metric=metric)
    session = boto3.session.Session(
        region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    sagemaker, scaling = session.client("sagemaker"), session.client("application-autoscaling")
    for client, operation, params in (
        (sagemaker, "CreateModel", plan.model_request),
        (sagemaker, "CreateEndpointConfig", plan.endpoint_config_request),
        (sagemaker, "CreateEndpoint", plan.endpoint_request),
        (scaling, "RegisterScalableTarget", plan.scaling.register_request()),
        (scaling, "PutScalingPolicy", plan.scaling.policy_request()),
    ):
        assert_valid_request(client, operation, params)
    tracking = plan.scaling.policy_request()["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == {"concurrency": 2.2, "invocations": 12.0}[metric]  # 10 s per request
