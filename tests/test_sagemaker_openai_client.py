"""The openai client example: every route goes to /invocations, signed with SigV4 (no network)."""

from __future__ import annotations

import json

import boto3
import deploy_fixtures
import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from neuron_ssp.deploy.sagemaker.openai_client import sagemaker_openai_client

aws_sandbox = deploy_fixtures.aws_sandbox


def test_chat_completion_goes_to_invocations_signed_for_sagemaker() -> None:
    seen: list[httpx.Request] = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "llama2-70b",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Paris."}}
                ],
                "speculative": {"acceptance_rate": 0.8},
            },
        )

    session = boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1"
    )
    client = sagemaker_openai_client("my-endpoint", "us-east-1", session, transport=httpx.MockTransport(endpoint))
    answer = client.chat.completions.create(model="llama2-70b", messages=[{"role": "user", "content": "Capital?"}])
    assert answer.choices[0].message.content == "Paris."
    (request,) = seen
    assert str(request.url) == "https://runtime.sagemaker.us-east-1.amazonaws.com/endpoints/my-endpoint/invocations"
    assert json.loads(request.content)["messages"][0]["content"] == "Capital?"
    authorization = request.headers["authorization"]
    assert (
        authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
        and "/sagemaker/aws4_request" in authorization
    )
    # the signature is the one botocore computes for the same request at the same time
    again = AWSRequest(
        method="POST",
        url=str(request.url),
        data=request.content,
        headers={"Content-Type": "application/json", "X-Amz-Date": request.headers["x-amz-date"]},
    )
    signer = SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "sagemaker", "us-east-1")
    again.context["timestamp"] = request.headers["x-amz-date"]
    signer.add_auth(again)
    assert again.headers["Authorization"] == authorization


def test_a_route_that_is_not_post_is_refused_before_anything_is_signed_or_sent() -> None:
    """SageMaker's /invocations takes POST only; a GET (models.list) would be signed as a POST and refused."""
    import pytest

    sent: list[httpx.Request] = []
    session = boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1"
    )
    client = sagemaker_openai_client(
        "my-endpoint",
        "us-east-1",
        session,
        transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(200)),
    )
    with pytest.raises(ValueError, match="GET /models: a SageMaker endpoint takes only POST"):
        client.models.list()
    assert sent == []
