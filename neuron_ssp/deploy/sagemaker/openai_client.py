"""An `openai` client that talks to a SageMaker endpoint running the neuron-ssp engine.

SageMaker accepts only POST /endpoints/NAME/invocations, signed with SigV4 (service "sagemaker"), and
our container reads OpenAI chat/completions bodies there. So every POST route (chat.completions,
completions) is sent to /invocations and signed with the caller's AWS credentials; a route of another
method (models.list is a GET) is refused before anything is signed. `stream=True` works but arrives
all at once: InvokeEndpoint returns the whole body, and the streaming call
(InvokeEndpointWithResponseStream) answers in AWS event-stream frames the openai client cannot read;
use `neuron-ssp deploy endpoint invoke --stream` for tokens as they come. Needs `openai`, `httpx`, boto3.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any


def sigv4_auth(endpoint: str, region: str, credentials: Any) -> Any:
    """An httpx.Auth that rewrites the path to /invocations and signs the request."""
    import httpx
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    class SageMakerSigV4(httpx.Auth):
        requires_request_body = True

        def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
            if request.method != "POST":
                raise ValueError(
                    f"{request.method} {request.url.path}: a SageMaker endpoint takes only POST /invocations "
                    "(chat.completions, completions)"
                )
            request.url = request.url.copy_with(path=f"/endpoints/{endpoint}/invocations", query=None)
            signed = AWSRequest(
                method="POST", url=str(request.url), data=request.content, headers={"Content-Type": "application/json"}
            )
            SigV4Auth(credentials, "sagemaker", region).add_auth(signed)
            request.headers.update(dict(signed.headers))
            yield request

    return SageMakerSigV4()


def sagemaker_openai_client(endpoint: str, region: str, session: Any = None, **http: Any) -> Any:
    """openai.OpenAI for endpoint NAME; `session` is a boto3 session (default credential chain)."""
    import httpx
    import openai

    from neuron_ssp.deploy import aws

    credentials = (session or aws.new_session()).get_credentials()
    return openai.OpenAI(
        base_url=f"https://runtime.sagemaker.{region}.amazonaws.com",
        api_key="sigv4",
        http_client=httpx.Client(auth=sigv4_auth(endpoint, region, credentials), **http),
    )
