"""Fixtures for the SageMaker endpoint tests, on top of deploy_fixtures (fake credentials, loopback only).

`moto` gives the end-to-end flow against a moto server on 127.0.0.1 (moto puts an endpoint InService
at once and cannot fail it); `stubbed_sagemaker` gives real clients behind botocore Stubber, for exact
request shapes and for the failure paths moto cannot play.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from botocore.validate import ParamValidator
from deploy_fixtures import REGION, FakeClock
from service_model_check import request_problems

from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.plan import EndpointOptions, Identity, plan_endpoint
from neuron_ssp.deploy.waiting import Pacing

ACCOUNT = "123456789012"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/neuron-ssp-sagemaker"
MODEL_S3 = "s3://neuron-ssp-test-models/llama2/"
IDENTITY = Identity(ACCOUNT, f"arn:aws:iam::{ACCOUNT}:user/alice")
ROOT = Path(__file__).resolve().parents[1]
INF2_CONFIG = ROOT / "configs" / "llama2-70b-7b-inf2-bf16.yaml"
TRN1_CONFIG = ROOT / "configs" / "llama2-70b-7b-trn1-bf16.yaml"
SAGEMAKER_POLICY = ROOT / "deploy" / "iam" / "sagemaker-operator-policy.json"
EXECUTION_ROLE = ROOT / "deploy" / "iam" / "sagemaker-execution-role.json"


def create_args(*extra: str) -> list[str]:
    """`deploy endpoint create` of the inf2 config with the test's model prefix and role, then `extra`."""
    return [
        "deploy",
        "endpoint",
        "create",
        str(INF2_CONFIG),
        "--region",
        REGION,
        "--model-s3",
        MODEL_S3,
        "--role-arn",
        ROLE_ARN,
        *extra,
    ]


def instant_pacing(clock: FakeClock | None = None) -> Pacing:
    clock = clock or FakeClock()
    return Pacing(interval_s=30, sleep=clock.sleep, clock=clock)


def endpoint_plan(config_path: Path = INF2_CONFIG, **options: Any):  # type: ignore[no-untyped-def]
    from neuron_ssp.config import load_config

    defaults: dict[str, Any] = {"name": "ep-test", "model_s3": MODEL_S3, "role_arn": ROLE_ARN}
    return plan_endpoint(
        load_config(config_path),
        config_path,
        EndpointOptions(**{**defaults, **options}),
        region=REGION,
        identity=IDENTITY,
        seconds_per_request=10.0,
    )


def assert_valid_request(client: Any, operation: str, params: dict[str, Any]) -> None:
    """botocore's own ParamValidator (types, required members, minimums), then what it skips: enums,
    patterns and maxima from the same service model."""
    model = client.meta.service_model.operation_model(operation)
    report = ParamValidator().validate(params, model.input_shape)
    assert not report.has_errors(), report.generate_report()
    assert request_problems(model, params) == []


@dataclass
class StubbedSageMaker:
    clients: SageMakerClients
    sagemaker: Stubber
    runtime: Stubber
    autoscaling: Stubber
    logs: Stubber
    ecr: Stubber
    sts: Stubber

    def all(self) -> tuple[Stubber, ...]:
        return (self.sagemaker, self.runtime, self.autoscaling, self.logs, self.ecr, self.sts)

    def assert_done(self) -> None:
        for stubber in self.all():
            stubber.assert_no_pending_responses()


@pytest.fixture(scope="module")
def sm_stub_session() -> Any:
    import boto3

    return boto3.session.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def stubbed_sagemaker(sm_stub_session: Any) -> Iterator[StubbedSageMaker]:
    clients = SageMakerClients.for_region(REGION, session=sm_stub_session)
    stubs = StubbedSageMaker(
        clients,
        *(
            Stubber(c)
            for c in (clients.sagemaker, clients.runtime, clients.autoscaling, clients.logs, clients.ecr, clients.sts)
        ),
    )
    for stubber in stubs.all():
        stubber.activate()
    yield stubs
    for stubber in stubs.all():
        stubber.deactivate()


def described(
    name: str = "ep-test", status: str = "InService", reason: str | None = None, instances: int = 1
) -> dict[str, Any]:
    """describe_endpoint as SageMaker answers it."""
    answer: dict[str, Any] = {
        "EndpointName": name,
        "EndpointArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{name}",
        "EndpointConfigName": name,
        "EndpointStatus": status,
        "CreationTime": datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc),
        "LastModifiedTime": datetime(2026, 11, 1, 12, 5, tzinfo=timezone.utc),
        "ProductionVariants": [
            {"VariantName": "AllTraffic", "CurrentInstanceCount": instances, "DesiredInstanceCount": instances}
        ],
    }
    if reason:
        answer["FailureReason"] = reason
    return answer


def client_error(stubber: Stubber, operation: str, code: str, message: str, status: int = 400) -> None:
    stubber.add_client_error(operation, service_error_code=code, service_message=message, http_status_code=status)


@pytest.fixture
def moto_hosts_neuron_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto 5's endpoint-config check predates ml.inf2/ml.trn1: accept every type in botocore's own enum."""
    import botocore.session
    from moto.sagemaker.models import FakeEndpointConfig

    enum = set(
        botocore.session.get_session().get_service_model("sagemaker").shape_for("ProductionVariantInstanceType").enum
    )
    original = FakeEndpointConfig.validate_instance_type

    def validate(self: Any, instance_type: str) -> None:
        if instance_type not in enum:
            original(self, instance_type)

    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", validate)
