"""Fixtures for the deploy tests. No test may reach AWS.

`aws_sandbox` (autouse in every deploy test module that takes it in) sets fake credentials, points
the AWS config files at nothing and makes any botocore HTTP request to a non-loopback host fail the
test. It also holds every request any client builds against the service model's enums, patterns and
maxima (`service_model_check`, what botocore's ParamValidator skips), moto and Stubber alike. Two ways
to answer the requests:

* `moto`: a ThreadedMotoServer on 127.0.0.1 (random port) for the end-to-end flow. What moto 5 lacks
  is supplied explicitly here: the Neuron DLAMIs are seeded into moto's public-AMI catalog (moto ships
  none) and its DescribeImages learns the `description` filter (moto raises FilterNotImplemented for
  it), `ssm:DescribeInstanceInformation` is answered "Online" by a botocore `before-call` hook (moto
  has no such API), and `FakeSsmAgent` plays the SSM agent (moto records commands but runs nothing and
  uploads no output; it answers the bootstrap status read with `ready`). Capacity reservations/blocks
  and the public /aws/service/neuron parameters are not in moto either; the Stubber tests cover them.
* `stubbed`: real boto3 clients behind botocore `Stubber`, which checks each request against the
  service model and against the exact parameters a test expects.
"""

from __future__ import annotations

import copy
import json
import os
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.httpsession import URLLib3Session
from botocore.stub import Stubber
from service_model_check import request_problems

from neuron_ssp.deploy.aws import AwsClients
from neuron_ssp.deploy.userdata import STATUS_FILE
from neuron_ssp.deploy.waiting import Pacing

REGION = "us-east-1"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRN1_CONFIG = CONFIGS / "llama2-70b-7b-trn1-bf16.yaml"
INF2_CONFIG = CONFIGS / "llama2-70b-7b-inf2-bf16.yaml"
DLAMI_PREFIX = "Deep Learning AMI Neuron (Ubuntu 22.04) "


@pytest.fixture(autouse=True)
def aws_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, no AWS config files, and HTTP only to loopback."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "COLUMNS": "250",  # rich panels/tables: no wrapping inside the strings tests look for
    }.items():
        monkeypatch.setenv(name, value)
    original_send = URLLib3Session.send

    def loopback_only(self: URLLib3Session, request: Any) -> Any:
        if urlsplit(request.url).hostname not in LOOPBACK:
            pytest.fail(f"a test tried to reach {request.url}; only the loopback moto server is allowed")
        return original_send(self, request)

    monkeypatch.setattr(URLLib3Session, "send", loopback_only)
    original_create_client = botocore.session.Session.create_client

    def checked_client(self: botocore.session.Session, *args: Any, **kwargs: Any) -> Any:
        client = original_create_client(self, *args, **kwargs)
        client.meta.events.register("provide-client-params", refuse_what_aws_would_refuse)  # before a Stubber looks
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", checked_client)


def refuse_what_aws_would_refuse(params: dict[str, Any], model: Any, **_: Any) -> None:
    """Fail the test on a request that breaks its operation's enums, patterns or maxima."""
    problems = request_problems(model, params)
    if problems:
        pytest.fail(f"{model.name} request AWS would refuse: " + "; ".join(problems))


# ---------------------------------------------------------------- moto server


def dlami_catalog() -> list[dict[str, Any]]:
    """Neuron DLAMIs as Amazon publishes them (owner alias 'amazon'), around SDK 2.25.

    The descriptions name the SDK release; their exact wording is our assumption, only the
    "Neuron SDK <version>" part matters to the pin.
    """

    def image(ami_id: str, name: str, sdk: str) -> dict[str, Any]:
        return {
            "ami_id": ami_id,
            "name": name,
            "state": "available",
            "public": True,
            "owner_id": "898082745236",
            "architecture": "x86_64",
            "root_device_type": "ebs",
            "root_device_name": "/dev/sda1",
            "virtualization_type": "hvm",
            "hypervisor": "xen",
            "image_type": "machine",
            "description": f"Supported EC2 instances: Inf2, Trn1, Trn1n, Trn2. Neuron SDK {sdk}, multi-framework",
            "creation_date": f"{name[-8:-4]}-{name[-4:-2]}-{name[-2:]}T00:00:00.000Z",
        }

    return [
        image("ami-0dlami2023may000", DLAMI_PREFIX + "20250515", "2.23.0"),  # pytorch_2_6 venv
        image("ami-0dlami2024jun000", DLAMI_PREFIX + "20250625", "2.24.0"),
        image("ami-0dlami2025aug000", DLAMI_PREFIX + "20250801", "2.25.0"),
        image("ami-0dlami2026sep000", DLAMI_PREFIX + "20250918", "2.26.0"),  # transformers-neuronx gone
        image("ami-0dlami225rebuild", DLAMI_PREFIX + "20251020", "2.25.1"),  # 2.25 rebuilt after 2.26: the pick
        image("ami-0dlamipt27aug000", "Deep Learning AMI Neuron PyTorch 2.7 (Ubuntu 22.04) 20250801", "2.25.0"),
    ]


PINNED_PICK = "ami-0dlami225rebuild"


class FakeClock:
    """Time that passes only when the code under test sleeps: waits and timeouts run instantly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def instant_pacing(clock: FakeClock | None = None) -> Pacing:
    clock = clock or FakeClock()
    return Pacing(interval_s=10, running_timeout_s=600, ssm_online_timeout_s=900, sleep=clock.sleep, clock=clock)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def bootstrap_ready(script: str) -> tuple[str, int]:
    """The instance's default answer: the bootstrap status file says `ready`, anything else prints nothing."""
    return ("ready\n", 0) if STATUS_FILE in script else ("", 0)


@dataclass
class FakeSsmAgent:
    """Plays the SSM agent moto does not have: answers pings, 'runs' commands, uploads their output."""

    endpoint: str
    respond: Callable[[str], tuple[str, int]] = bootstrap_ready
    sent: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)
    actions: set[str] = field(default_factory=set)  # IAM actions the deploy code needed, e.g. ec2:RunInstances
    requests: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (service, operation, params)
    s3: Any = None  # the agent's own client, for uploading command output

    def reset(self) -> None:
        self.respond = bootstrap_ready
        self.sent.clear()
        self.outputs.clear()
        self.actions.clear()
        self.requests.clear()

    def attach(self, session: Any) -> None:
        session.events.register("before-parameter-build.*.*", self.record_action)
        session.events.register("before-call.ssm.DescribeInstanceInformation", self.describe_instance_information)
        session.events.register("after-call.ssm.SendCommand", self.on_send_command)
        session.events.register("after-call.ssm.GetCommandInvocation", self.on_get_invocation)

    def record_action(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        action = {"ListObjectsV2": "ListBucket"}.get(model.name, model.name)
        self.actions.add(f"{model.service_model.signing_name}:{action}")
        self.requests.append((model.service_model.service_name, model.name, copy.deepcopy(params)))

    def describe_instance_information(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict]:
        request = json.loads(params["body"])  # before-call sees the serialized request
        ids = [v for f in request.get("Filters", []) if f["Key"] == "InstanceIds" for v in f["Values"]]
        body = {"InstanceInformationList": [{"InstanceId": i, "PingStatus": "Online"} for i in ids]}
        return AWSResponse("http://127.0.0.1/", 200, {}, None), body

    def on_send_command(self, parsed: dict[str, Any], **_: Any) -> None:
        command = parsed["Command"]
        script = "\n".join(command["Parameters"]["commands"])
        stdout, code = self.respond(script)
        self.sent.append(command)
        self.outputs[command["CommandId"]] = (stdout, code)
        if command.get("OutputS3BucketName"):
            s3 = self.s3 or boto3.client("s3", region_name=REGION, endpoint_url=self.endpoint)
            self.s3 = s3
            for instance_id in command["InstanceIds"]:
                key = "/".join(
                    p
                    for p in (
                        command.get("OutputS3KeyPrefix"),
                        command["CommandId"],
                        instance_id,
                        "awsrunShellScript",
                        "0.awsrunShellScript",
                        "stdout",
                    )
                    if p
                )
                s3.put_object(Bucket=command["OutputS3BucketName"], Key=key, Body=stdout.encode())

    def on_get_invocation(self, parsed: dict[str, Any], **_: Any) -> None:
        stdout, code = self.outputs.get(parsed.get("CommandId", ""), ("", 0))
        parsed["StandardOutputContent"] = stdout[:24_000]  # what the real API keeps inline
        parsed["ResponseCode"] = code
        parsed["Status"] = "Success" if code == 0 else "Failed"


@pytest.fixture(scope="module")
def moto_session(moto_endpoint: str) -> tuple[Any, FakeSsmAgent]:
    """One boto3 session for the module (service models load once) with the fake agent attached."""
    agent = FakeSsmAgent(moto_endpoint)
    session = boto3.session.Session()
    agent.attach(session)
    return session, agent


@pytest.fixture
def moto(moto_endpoint: str, moto_session: tuple[Any, FakeSsmAgent], monkeypatch: pytest.MonkeyPatch) -> FakeSsmAgent:
    """A fresh moto state with Neuron DLAMIs; the deploy code's sessions come with the fake agent."""
    from moto.ec2.models import amis

    monkeypatch.setattr(amis, "AMIS", [*copy.deepcopy(amis.AMIS), *dlami_catalog()])
    moto_filter = amis.Ami.get_filter_value

    def with_description(ami: Any, filter_name: str, method_name: str | None = None) -> Any:
        return ami.description if filter_name == "description" else moto_filter(ami, filter_name, method_name)

    monkeypatch.setattr(amis.Ami, "get_filter_value", with_description)
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    session, agent = moto_session
    agent.reset()
    monkeypatch.setattr("neuron_ssp.deploy.aws.new_session", lambda: session)
    return agent


def moto_client(service: str) -> Any:
    """A client for arranging moto state (the endpoint comes from AWS_ENDPOINT_URL)."""
    return boto3.client(service, region_name=REGION)


def create_instance_profile(name: str = "neuron-ssp-instance") -> str:
    iam = moto_client("iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}}],
    }
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    iam.create_instance_profile(InstanceProfileName=name)
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return name


# ---------------------------------------------------------------- Stubber


@dataclass
class StubbedAws:
    clients: AwsClients
    ec2: Stubber
    ssm: Stubber
    s3: Stubber
    sts: Stubber

    def assert_done(self) -> None:
        for stubber in (self.ec2, self.ssm, self.s3, self.sts):
            stubber.assert_no_pending_responses()


@pytest.fixture(scope="module")
def stub_session() -> Any:
    """One session per module: service models load once, each test still gets fresh clients."""
    return boto3.session.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def stubbed(stub_session: Any) -> Iterator[StubbedAws]:
    """Real clients whose every call must be queued on its Stubber (nothing goes over the network)."""
    clients = AwsClients.for_region(REGION, session=stub_session)
    stubs = StubbedAws(clients, Stubber(clients.ec2), Stubber(clients.ssm), Stubber(clients.s3), Stubber(clients.sts))
    for stubber in (stubs.ec2, stubs.ssm, stubs.s3, stubs.sts):
        stubber.activate()
    yield stubs
    for stubber in (stubs.ec2, stubs.ssm, stubs.s3, stubs.sts):
        stubber.deactivate()


def instance(
    instance_id: str = "i-0123456789abcdef0",
    state: str = "running",
    *,
    name: str = "llama2-70b-7b-trn1-bf16",
    instance_type: str = "trn1.32xlarge",
    tags: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A describe_instances Instance as EC2 returns it."""
    from datetime import datetime, timezone

    all_tags = {"Project": "neuron-ssp", "neuron-ssp:deployment": name, "Name": name, **(tags or {})}
    return {
        "InstanceId": instance_id,
        "InstanceType": instance_type,
        "State": {"Code": 16, "Name": state},
        "LaunchTime": datetime(2025, 8, 1, 12, 0, tzinfo=timezone.utc),
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()],
        **extra,
    }


def reservations(*instances: dict[str, Any]) -> dict[str, Any]:
    return {
        "Reservations": [{"ReservationId": "r-0123456789abcdef0", "Instances": list(instances)}] if instances else []
    }


# ---------------------------------------------------------------- canned EC2/SSM/STS answers for Stubber

OWNER_ARN = "arn:aws:iam::123456789012:user/alice"
INSTANCE_ID = "i-0123456789abcdef0"


def dlami_images() -> dict[str, Any]:
    """describe_images as AWS answers the pinned query (creation dates as strings, like the API)."""
    return {
        "Images": [
            {
                "ImageId": img["ami_id"],
                "Name": img["name"],
                "CreationDate": img["creation_date"],
                "Description": img["description"],
                "RootDeviceName": img["root_device_name"],
                "Architecture": "x86_64",
                "State": "available",
            }
            for img in dlami_catalog()
        ]
    }


def queue_plan(stubs: StubbedAws, name: str, *, reservation: dict[str, Any] | None = None) -> None:
    """The read-only calls of prepare_launch, in order: name check, DLAMI, [reservation], caller identity."""
    from botocore.stub import ANY

    stubs.ec2.add_response("describe_instances", reservations(), {"Filters": ANY})
    stubs.ec2.add_response(
        "describe_images", dlami_images(), {"Owners": ["amazon"], "IncludeDeprecated": True, "Filters": ANY}
    )
    if reservation is not None:
        stubs.ec2.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [reservation]},
            {"CapacityReservationIds": [reservation["CapacityReservationId"]]},
        )
    stubs.sts.add_response(
        "get_caller_identity", {"Arn": OWNER_ARN, "Account": "123456789012", "UserId": "AIDAEXAMPLE"}, {}
    )


def queue_run_instances(
    stubs: StubbedAws, expected: dict[str, Any] | None = None, instance_id: str = INSTANCE_ID
) -> None:
    """expected None: any parameters (the request-shape tests pass the exact dict)."""
    response = {"Instances": [{"InstanceId": instance_id, "State": {"Code": 0, "Name": "pending"}}]}
    stubs.ec2.add_response("run_instances", response, expected)


def queue_running(stubs: StubbedAws, instance_id: str = INSTANCE_ID, state: str = "running", **extra: Any) -> None:
    stubs.ec2.add_response(
        "describe_instances", reservations(instance(instance_id, state, **extra)), {"InstanceIds": [instance_id]}
    )


def queue_ping(stubs: StubbedAws, status: str | None = "Online", instance_id: str = INSTANCE_ID) -> None:
    info = [{"InstanceId": instance_id, "PingStatus": status}] if status else []
    stubs.ssm.add_response(
        "describe_instance_information",
        {"InstanceInformationList": info},
        {"Filters": [{"Key": "InstanceIds", "Values": [instance_id]}]},
    )


def queue_terminate(stubs: StubbedAws, instance_id: str = INSTANCE_ID) -> None:
    stubs.ec2.add_response(
        "terminate_instances",
        {"TerminatingInstances": [{"InstanceId": instance_id, "CurrentState": {"Code": 32, "Name": "shutting-down"}}]},
        {"InstanceIds": [instance_id]},
    )


def queue_bootstrap(stubs: StubbedAws, *statuses: str, instance_id: str = INSTANCE_ID) -> None:
    """launch's bootstrap wait: per status, a status read (send_command) and its finished invocation."""
    from botocore.stub import ANY

    for n, status in enumerate(statuses):
        command_id = f"00000000-0000-4000-8000-{n:012d}"  # SSM command ids are UUIDs
        stubs.ssm.add_response(
            "send_command",
            {"Command": {"CommandId": command_id}},
            {
                "InstanceIds": [instance_id],
                "DocumentName": "AWS-RunShellScript",
                "Parameters": ANY,
                "TimeoutSeconds": ANY,
                "Comment": "neuron-ssp bootstrap status",
            },
        )
        stubs.ssm.add_response(
            "get_command_invocation",
            {"Status": "Success", "StandardOutputContent": f"{status}\n", "ResponseCode": 0},
            {"CommandId": command_id, "InstanceId": instance_id},
        )
