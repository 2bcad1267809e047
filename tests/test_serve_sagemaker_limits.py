"""SageMaker's real-time limit: InvokeEndpoint gives the container 60 s (its API reference, also in botocore's
service model). The server gives up first by default under --sagemaker, and the invoke client waits longer
than the platform and never re-sends a generation."""

from __future__ import annotations

import boto3
import botocore.session

from neuron_ssp.config import SAGEMAKER_INVOKE_LIMIT, ServeConfig, load_config
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients


def test_the_platform_limit_is_the_one_botocore_documents():
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    doc = model.operation_model("InvokeEndpoint").documentation
    assert f"respond to requests within {SAGEMAKER_INVOKE_LIMIT:.0f} seconds" in doc


def test_under_sagemaker_request_timeout_defaults_below_the_platform_limit_and_an_explicit_one_wins():
    assert ServeConfig().timeout_s == 300
    assert ServeConfig(sagemaker=True).timeout_s < SAGEMAKER_INVOKE_LIMIT
    assert load_config(None, {"serve.sagemaker": True}).serve.timeout_s < SAGEMAKER_INVOKE_LIMIT
    assert ServeConfig(sagemaker=True, request_timeout=120).timeout_s == 120


def test_the_invoke_client_reads_past_the_limit_and_does_not_retry_while_the_others_do():
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    clients = SageMakerClients.for_region("us-east-1", session=session)
    runtime = clients.runtime.meta.config
    assert runtime.read_timeout > SAGEMAKER_INVOKE_LIMIT
    assert runtime.retries["total_max_attempts"] == 1  # botocore's max_attempts counts retries only: 1 would retry
    assert clients.sagemaker.meta.config.retries["total_max_attempts"] == 6
