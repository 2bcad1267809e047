"""Failure paths of `deploy endpoint create/invoke` through the CLI, with botocore Stubber.

Failed with FailureReason (log tail shown, everything created deleted), --keep-on-failure (what still
bills, with $/h), Ctrl-C while waiting, AccessDenied (action + policy file), a SageMaker quota.
"""

from __future__ import annotations

import deploy_fixtures
import pytest
import sagemaker_fixtures
from click.testing import CliRunner
from deploy_fixtures import REGION
from sagemaker_fixtures import (
    ACCOUNT,
    StubbedSageMaker,
    client_error,
    create_args,
    described,
    instant_pacing,
)

from neuron_ssp.cli import endpoint as endpoint_cli
from neuron_ssp.cli import main
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients

aws_sandbox = deploy_fixtures.aws_sandbox
sm_stub_session = sagemaker_fixtures.sm_stub_session
stubbed_sagemaker = sagemaker_fixtures.stubbed_sagemaker
NAME = "ep-fail"
GROUP = f"/aws/sagemaker/Endpoints/{NAME}"


@pytest.fixture
def patched(stubbed_sagemaker: StubbedSageMaker, monkeypatch: pytest.MonkeyPatch) -> StubbedSageMaker:
    """The CLI gets the stubbed clients."""
    monkeypatch.setattr(
        SageMakerClients, "for_region", classmethod(lambda cls, region, session=None: stubbed_sagemaker.clients)
    )
    monkeypatch.setattr(endpoint_cli, "PACING", instant_pacing())
    return stubbed_sagemaker


@pytest.fixture
def stubs(patched: StubbedSageMaker) -> StubbedSageMaker:
    """For create: caller identity and the name check are queued first."""
    patched.sts.add_response(
        "get_caller_identity", {"Account": ACCOUNT, "UserId": "AIDA", "Arn": f"arn:aws:iam::{ACCOUNT}:user/alice"}, {}
    )
    queue_name_free(patched)
    return patched


def queue_name_free(stubs: StubbedSageMaker, exists: str | None = None) -> None:
    """The read-only name check before create: nothing of that name exists (or `exists` does)."""
    for operation, key in (
        ("describe_endpoint", "EndpointName"),
        ("describe_endpoint_config", "EndpointConfigName"),
        ("describe_model", "ModelName"),
    ):
        if operation == exists:
            stubs.sagemaker.add_response(operation, described(NAME, "InService"), {key: NAME})
            continue
        queue_not_found(stubs, operation, key)


def queue_not_found(stubs: StubbedSageMaker, operation: str, key: str) -> None:
    stubs.sagemaker.add_client_error(
        operation,
        service_error_code="ValidationException",
        service_message=f"Could not find {key} '{NAME}'.",
        expected_params={key: NAME},
    )


def refuse_create_endpoint(stubs: StubbedSageMaker, code: str, message: str, status: int = 400) -> None:
    """Model and endpoint config are created; CreateEndpoint gets `code` back."""
    queue_created(stubs, upto="config")
    client_error(stubs.sagemaker, "create_endpoint", code, message, status)


def create(*extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, create_args("--name", NAME, "--yes", *extra))
    return result.exit_code, result.output


def queue_created(stubs: StubbedSageMaker, upto: str = "endpoint") -> None:
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
    stubs.sagemaker.add_response("create_model", {"ModelArn": f"{arn}:model/{NAME}"})
    if upto == "model":
        return
    stubs.sagemaker.add_response("create_endpoint_config", {"EndpointConfigArn": f"{arn}:endpoint-config/{NAME}"})
    if upto == "config":
        return
    stubs.sagemaker.add_response("create_endpoint", {"EndpointArn": f"{arn}:endpoint/{NAME}"})


def queue_log_tail(stubs: StubbedSageMaker) -> None:
    stubs.logs.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": "AllTraffic/i-0abc"}]},
        {"logGroupName": GROUP, "orderBy": "LastEventTime", "descending": True, "limit": 2},
    )
    stubs.logs.add_response(
        "get_log_events",
        {
            "events": [
                {"timestamp": 1_790_000_000_000, "message": "neuron-ssp: loading /opt/ml/model/Llama-2-70b-hf"},
                {
                    "timestamp": 1_790_000_001_000,
                    "message": "FileNotFoundError: /opt/ml/model/Llama-2-70b-hf/config.json",
                },
            ]
        },
        {"logGroupName": GROUP, "logStreamName": "AllTraffic/i-0abc", "limit": 40, "startFromHead": False},
    )


def queue_cleanup(stubs: StubbedSageMaker, *, endpoint: bool = True, config: bool = True) -> None:
    """describe then delete, piece by piece (a delete of something missing would be refused by the policy)."""
    if endpoint:
        stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Failed"), {"EndpointName": NAME})
        stubs.sagemaker.add_response("delete_endpoint", {}, {"EndpointName": NAME})
    if config:
        queue_config_describe(stubs)
        stubs.sagemaker.add_response("delete_endpoint_config", {}, {"EndpointConfigName": NAME})
    queue_model_delete(stubs)


def queue_config_describe(stubs: StubbedSageMaker) -> None:
    stubs.sagemaker.add_response(
        "describe_endpoint_config",
        {
            "EndpointConfigName": NAME,
            "EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint-config/x",
            "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": NAME}],
            "CreationTime": described()["CreationTime"],
        },
        {"EndpointConfigName": NAME},
    )


def queue_model_delete(stubs: StubbedSageMaker) -> None:
    stubs.sagemaker.add_response(
        "describe_model",
        {
            "ModelName": NAME,
            "CreationTime": described()["CreationTime"],
            "ModelArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model/x",
        },
        {"ModelName": NAME},
    )
    stubs.sagemaker.add_response("delete_model", {}, {"ModelName": NAME})


REASON = "The primary container for production variant AllTraffic did not pass the ping health check."


def test_failed_endpoint_shows_reason_and_log_tail_then_deletes_everything(stubs: StubbedSageMaker) -> None:
    queue_created(stubs)
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Creating"), {"EndpointName": NAME})
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Failed", REASON), {"EndpointName": NAME})
    queue_log_tail(stubs)
    queue_cleanup(stubs)
    code, out = create()
    assert code == 1, out
    assert "went to Failed" in out and "did not pass the ping health check" in out
    assert "FileNotFoundError: /opt/ml/model/Llama-2-70b-hf/config.json" in out
    assert "deleted what was created (endpoint, endpoint config, model); nothing is left billing" in out
    stubs.assert_done()


def test_keep_on_failure_deletes_nothing_and_says_what_bills(stubs: StubbedSageMaker) -> None:
    queue_created(stubs)
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Failed", REASON), {"EndpointName": NAME})
    queue_log_tail(stubs)
    code, out = create("--keep-on-failure")
    assert code == 1, out
    assert "kept after the failure: endpoint, endpoint config, model" in out
    assert "the endpoint bills 1 × ml.inf2.48xlarge in us-east-1 at $15.58/h" in out
    assert f"neuron-ssp deploy endpoint delete {NAME} --region {REGION}" in out
    stubs.assert_done()  # no delete_* was queued, so none was called


def interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


def ctrl_c_while_waiting(stubs: StubbedSageMaker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint_cli, "PACING", endpoint_cli.Pacing(interval_s=30, sleep=interrupt))
    queue_created(stubs)
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Creating"), {"EndpointName": NAME})


def ctrl_c_during_create_endpoint(stubs: StubbedSageMaker, monkeypatch: pytest.MonkeyPatch) -> None:
    """After SageMaker took the request, before its answer was read: the endpoint exists, unconfirmed."""
    queue_created(stubs)
    stubs.clients.sagemaker.meta.events.register("after-call.sagemaker.CreateEndpoint", interrupt)


@pytest.mark.parametrize("ctrl_c", [ctrl_c_while_waiting, ctrl_c_during_create_endpoint])
def test_ctrl_c_deletes_what_was_created(stubs: StubbedSageMaker, monkeypatch: pytest.MonkeyPatch, ctrl_c) -> None:
    ctrl_c(stubs, monkeypatch)
    queue_cleanup(stubs)
    code, out = create()
    assert code == 1, out
    assert "interrupted before the endpoint was InService" in out
    assert "deleted what was created (endpoint, endpoint config, model)" in out
    stubs.assert_done()


def test_access_denied_names_the_action_and_the_policy_file(stubs: StubbedSageMaker) -> None:
    client_error(
        stubs.sagemaker,
        "create_model",
        "AccessDeniedException",
        f"User: arn:aws:iam::{ACCOUNT}:user/alice is not authorized to perform: sagemaker:CreateModel",
        403,
    )
    queue_not_found(stubs, "describe_model", "ModelName")  # the request was sent: cleanup looks it up
    code, out = create()
    assert code == 1, out
    assert "sagemaker:CreateModel" in out and "deploy/iam/sagemaker-operator-policy.json" in out
    assert "deleted what was created" not in out  # nothing had been created, nothing to delete
    stubs.assert_done()


def test_quota_exceeded_names_the_quota_to_request_and_cleans_up(stubs: StubbedSageMaker) -> None:
    refuse_create_endpoint(
        stubs,
        "ResourceLimitExceeded",
        "The account-level service limit 'ml.inf2.48xlarge for endpoint usage' is 0 Instances, with current "
        "utilization of 0 Instances and a request delta of 1 Instances. Please use AWS Service Quotas to "
        "request an increase for this quota.",
    )
    queue_not_found(stubs, "describe_endpoint", "EndpointName")
    queue_cleanup(stubs, endpoint=False)
    code, out = create()
    assert code == 1, out
    assert "request 'ml.inf2.48xlarge for endpoint usage' in Service Quotas -> Amazon SageMaker (us-east-1)" in out
    assert "deleted what was created (endpoint config, model)" in out
    stubs.assert_done()


def test_invoke_access_denied_names_invoke_endpoint(patched: StubbedSageMaker) -> None:
    stubs = patched
    client_error(stubs.runtime, "invoke_endpoint_with_response_stream", "AccessDeniedException", "not authorized", 403)
    result = CliRunner().invoke(
        main, ["deploy", "endpoint", "invoke", NAME, "--region", REGION, "--prompt", "hi", "--stream"]
    )
    assert result.exit_code == 1, result.output
    assert "sagemaker:InvokeEndpoint" in result.output and "sagemaker-operator-policy.json" in result.output


def test_cleanup_that_is_refused_says_what_may_still_bill(stubs: StubbedSageMaker) -> None:
    queue_created(stubs)
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Failed", REASON), {"EndpointName": NAME})
    stubs.logs.add_client_error(
        "describe_log_streams",
        service_error_code="ResourceNotFoundException",
        service_message="The specified log group does not exist.",
    )
    stubs.sagemaker.add_response("describe_endpoint", described(NAME, "Failed"), {"EndpointName": NAME})
    client_error(stubs.sagemaker, "delete_endpoint", "AccessDeniedException", "not authorized", 403)
    queue_config_describe(stubs)
    stubs.sagemaker.add_response("delete_endpoint_config", {}, {"EndpointConfigName": NAME})
    queue_model_delete(stubs)
    code, out = create()
    assert code == 1, out
    assert "the container never started" in out  # no log group yet
    assert "could NOT delete endpoint (your AWS identity may not call sagemaker:DeleteEndpoint" in out
    assert "it may still bill 1 × ml.inf2.48xlarge in us-east-1 at $15.58/h" in out
    assert f"aws sagemaker delete-endpoint --endpoint-name {NAME} --region {REGION}" in out
    stubs.assert_done()


def test_status_of_a_missing_endpoint_points_at_list(patched: StubbedSageMaker) -> None:
    stubs = patched
    client_error(
        stubs.sagemaker,
        "describe_endpoint",
        "ValidationException",
        f'Could not find endpoint "arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/nope".',
    )
    result = CliRunner().invoke(main, ["deploy", "endpoint", "status", "nope", "--region", REGION])
    assert result.exit_code == 2, result.output
    assert "no endpoint of that name in us-east-1" in result.output and "deploy endpoint list" in result.output


def test_a_name_in_use_is_refused_before_anything_is_created(patched: StubbedSageMaker) -> None:
    patched.sts.add_response(
        "get_caller_identity", {"Account": ACCOUNT, "UserId": "AIDA", "Arn": f"arn:aws:iam::{ACCOUNT}:user/alice"}, {}
    )
    queue_name_free(patched, exists="describe_endpoint")
    code, out = create()
    assert code == 2, out
    assert "already in use in us-east-1: endpoint (InService)" in out and f"deploy endpoint delete {NAME}" in out
    patched.assert_done()  # no create_* was queued, so none was called


def test_an_endpoint_whose_create_answer_was_lost_is_found_and_deleted(stubs: StubbedSageMaker) -> None:
    """botocore's retry of a timed-out CreateEndpoint is told "already existing": the first one went through."""
    refuse_create_endpoint(
        stubs,
        "ValidationException",
        f'Cannot create already existing endpoint "arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{NAME}".',
    )
    queue_cleanup(stubs)  # the endpoint is looked up, found and deleted, then config and model
    code, out = create()
    assert code == 1, out
    assert "deleted what was created (endpoint, endpoint config, model); nothing is left billing" in out
    stubs.assert_done()


def test_a_refused_create_endpoint_is_looked_up_and_only_what_exists_is_deleted(stubs: StubbedSageMaker) -> None:
    refuse_create_endpoint(stubs, "AccessDeniedException", "not authorized", 403)
    queue_not_found(stubs, "describe_endpoint", "EndpointName")
    queue_cleanup(stubs, endpoint=False)
    code, out = create()
    assert code == 1, out
    assert "deleted what was created (endpoint config, model); nothing is left billing" in out
    stubs.assert_done()
