"""deploy/iam/operator-policy.json judged by the requests it must allow and the ones it must refuse.

RunInstances is authorized per resource it touches (instance, volume, image, subnet, ...), each with
its own condition keys. `launch_requests` derives those from the exact request `prepare_launch` builds,
using only keys that EC2 evaluates for that resource (SUPPORTED_KEYS, from the AWS Service Authorization
Reference), so the policy is tested against what AWS will really check, not against action names.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import botocore.session
import deploy_fixtures
import iam_policy
import pytest
from aws_authorization import ec2_arn as arn
from aws_authorization import run_instances as launch_requests
from botocore import xform_name
from deploy_fixtures import REGION, TRN1_CONFIG, StubbedAws, queue_plan

from neuron_ssp.config import load_config
from neuron_ssp.deploy.capacity import CapacityTarget
from neuron_ssp.deploy.launch import prepare_launch
from neuron_ssp.deploy.launch_plan import LaunchOptions

ROOT = Path(__file__).resolve().parents[1]
POLICY = iam_policy.load(ROOT / "deploy" / "iam" / "operator-policy.json")
ACCOUNT = "123456789012"
NOW = datetime(2025, 8, 1, 12, 0, tzinfo=timezone.utc)

# Condition keys the services evaluate, per (action, resource type): AWS Service Authorization Reference
# ("Actions, resources, and condition keys for Amazon EC2 / AWS Systems Manager / IAM / KMS"), as carried
# by parliament 1.6.4's iam_definition.json. A trailing "/" stands for a tag key.
SUPPORTED_KEYS = {
    ("ec2:RunInstances", "instance"): {
        "aws:RequestTag/",
        "ec2:InstanceType",
        "ec2:MetadataHttpTokens",
        "ec2:InstanceMarketType",
    },
    ("ec2:RunInstances", "volume"): {"aws:RequestTag/", "ec2:Encrypted", "ec2:VolumeType"},
    ("ec2:RunInstances", "image"): {"ec2:Owner"},
    ("ec2:RunInstances", "subnet"): set(),
    ("ec2:RunInstances", "network-interface"): {"aws:RequestTag/"},
    ("ec2:RunInstances", "security-group"): set(),
    ("ec2:RunInstances", "key-pair"): set(),
    ("ec2:RunInstances", "capacity-reservation"): set(),
    ("ec2:CreateTags", "instance"): {"ec2:CreateAction", "aws:RequestTag/", "aws:ResourceTag/", "aws:TagKeys"},
    ("ec2:CreateTags", "volume"): {"ec2:CreateAction", "aws:RequestTag/"},
    ("ec2:TerminateInstances", "instance"): {"aws:ResourceTag/"},
    ("ec2:GetConsoleOutput", "instance"): {"aws:ResourceTag/"},
    ("ssm:SendCommand", "instance"): {"ssm:resourceTag/", "aws:ResourceTag/"},
    ("ssm:SendCommand", "document"): set(),
    ("iam:PassRole", "role"): {"iam:PassedToService"},
}

aws_sandbox = deploy_fixtures.aws_sandbox
stub_session = deploy_fixtures.stub_session
stubbed = deploy_fixtures.stubbed


def planned_params(stubbed: StubbedAws) -> dict[str, Any]:
    """The run_instances request of a Capacity Block launch with every optional resource in it."""
    block = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "InstanceType": "trn1.32xlarge",
        "AvailabilityZone": "us-east-1d",
        "State": "active",
        "AvailableInstanceCount": 1,
        "ReservationType": "capacity-block",
        "EndDate": datetime(2099, 1, 1, tzinfo=timezone.utc),
    }
    queue_plan(stubbed, "trn1", reservation=block)
    options = LaunchOptions(
        region=REGION,
        name="trn1",
        instance_profile="neuron-ssp-instance",
        key_name="me",
        subnet_id="subnet-0abc",
        security_group_ids=("sg-01",),
        capacity=CapacityTarget("cr-0123456789abcdef0", is_block=True),
    )
    return prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW).params


def resource_type(resource_arn: str) -> str:
    return resource_arn.split(":", 5)[5].split("/")[0]


def test_the_exact_launch_request_is_allowed_and_asks_only_keys_aws_evaluates(stubbed: StubbedAws) -> None:
    for action, resource, context in launch_requests(planned_params(stubbed)):
        supported = SUPPORTED_KEYS[(action, resource_type(resource))]
        for key in context:
            assert key in supported or key.rsplit("/", 1)[0] + "/" in supported, (action, resource, key)
        assert iam_policy.allows(POLICY, action, resource, context), (action, resource, context)


def tokens_optional(p: dict) -> None:
    p["MetadataOptions"]["HttpTokens"] = "optional"


def unencrypted(p: dict) -> None:
    p["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] = False


def other_type(p: dict) -> None:
    p["InstanceType"] = "p5.48xlarge"


def untagged(p: dict) -> None:
    for spec in p["TagSpecifications"]:
        spec["Tags"] = [t for t in spec["Tags"] if t["Key"] != "Project"]


@pytest.mark.parametrize(
    ("change", "owner", "refused"),
    [
        (tokens_optional, "amazon", "instance"),  # IMDSv1 would let any process on the host read the role's keys
        (unencrypted, "amazon", "volume"),
        (other_type, "amazon", "instance"),
        (untagged, "amazon", "instance"),
        (None, "111122223333", "image"),  # only Amazon's images (the DLAMIs)
    ],
)
def test_the_policy_refuses_launches_outside_its_conditions(
    stubbed: StubbedAws, change: Any, owner: str, refused: str
) -> None:
    params = planned_params(stubbed)
    if change:
        change(params)
    denied = {
        resource_type(resource)
        for action, resource, context in launch_requests(params, owner)
        if action == "ec2:RunInstances" and not iam_policy.allows(POLICY, action, resource, context)
    }
    assert refused in denied


@pytest.mark.parametrize(
    ("action", "resource", "context", "allowed"),
    [
        ("ec2:TerminateInstances", arn("instance/i-1"), {"aws:ResourceTag/Project": "neuron-ssp"}, True),
        ("ec2:TerminateInstances", arn("instance/i-1"), {"aws:ResourceTag/Project": "billing-db"}, False),
        ("ec2:TerminateInstances", arn("instance/i-1"), {}, False),
        ("ec2:GetConsoleOutput", arn("instance/i-1"), {"aws:ResourceTag/Project": "neuron-ssp"}, True),
        ("ec2:GetConsoleOutput", arn("instance/i-1"), {"aws:ResourceTag/Project": "billing-db"}, False),
        ("ssm:SendCommand", arn("instance/i-1"), {"ssm:resourceTag/Project": "neuron-ssp"}, True),
        ("ssm:SendCommand", arn("instance/i-1"), {"ssm:resourceTag/Project": "billing-db"}, False),
        ("ssm:SendCommand", f"arn:aws:ssm:{REGION}::document/AWS-RunShellScript", {}, True),
        ("ssm:SendCommand", f"arn:aws:ssm:{REGION}::document/AWS-RunPowerShellScript", {}, False),
        ("ec2:CreateTags", arn("instance/i-1"), {"ec2:CreateAction": "RunInstances"}, True),
        ("ec2:CreateTags", arn("instance/i-1"), {}, False),  # retagging an existing instance
        # `deploy extend`: only the expiry of this tool's instances may be retagged
        (
            "ec2:CreateTags",
            arn("instance/i-1"),
            {"aws:ResourceTag/Project": "neuron-ssp", "aws:TagKeys": ["neuron-ssp:expires-at"]},
            True,
        ),
        (
            "ec2:CreateTags",
            arn("instance/i-1"),
            {"aws:ResourceTag/Project": "neuron-ssp", "aws:TagKeys": ["neuron-ssp:expires-at", "Project"]},
            False,
        ),
        (
            "ec2:CreateTags",
            arn("instance/i-1"),
            {"aws:ResourceTag/Project": "billing-db", "aws:TagKeys": ["neuron-ssp:expires-at"]},
            False,
        ),
        (
            "iam:PassRole",
            f"arn:aws:iam::{ACCOUNT}:role/neuron-ssp-instance",
            {"iam:PassedToService": "ec2.amazonaws.com"},
            True,
        ),
        ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/admin", {"iam:PassedToService": "ec2.amazonaws.com"}, False),
        (
            "iam:PassRole",
            f"arn:aws:iam::{ACCOUNT}:role/neuron-ssp-instance",
            {"iam:PassedToService": "lambda.amazonaws.com"},
            False,
        ),
    ],
)
def test_tag_scoped_actions_check_resource_and_conditions(
    action: str, resource: str, context: dict, allowed: bool
) -> None:
    supported = SUPPORTED_KEYS[(action, resource_type(resource))]
    assert all(k in supported or k.rsplit("/", 1)[0] + "/" in supported for k in context)
    assert iam_policy.allows(POLICY, action, resource, context) is allowed


# ---------------------------------------------------------------- what the docs and hints tell users to run

_AWS_COMMAND = re.compile(r"\baws (ec2|ssm|sts) ([a-z][a-z0-9-]+)")
HINT_SOURCES = [
    ROOT / "deploy" / "README.md",
    ROOT / "neuron_ssp" / "cli" / "deploy.py",
    *sorted((ROOT / "neuron_ssp" / "deploy").glob("*.py")),
]


def operator_commands() -> set[tuple[str, str]]:
    """(service, CLI command) of every `aws ec2|ssm|sts ...` the README and the error hints suggest."""
    return {m.groups() for path in HINT_SOURCES for m in _AWS_COMMAND.finditer(path.read_text())}


def iam_action(service: str, command: str) -> str:
    model = botocore.session.get_session().get_service_model(service)
    by_command = {xform_name(op).replace("_", "-"): op for op in model.operation_names}
    return f"{service}:{by_command[command]}"


PURCHASE = iam_policy.load(ROOT / "deploy" / "iam" / "capacity-block-purchase-policy.json")


def test_the_policy_grants_every_call_the_walkthrough_and_hints_suggest_but_buying() -> None:
    commands = operator_commands()
    # the walkthrough buys a Capacity Block; capacity errors point at other AZs; denials at decoding
    assert {
        ("ec2", "describe-capacity-block-offerings"),
        ("ec2", "purchase-capacity-block"),
        ("ec2", "describe-instance-type-offerings"),
        ("sts", "decode-authorization-message"),
    } <= commands
    missing = sorted(a for a in (iam_action(*c) for c in commands) if not iam_policy.grants_action(POLICY, a))
    # a non-refundable purchase the code never makes: only the separate opt-in policy grants it
    assert missing == ["ec2:PurchaseCapacityBlock"]
    block = arn("capacity-reservation/cr-0123456789abcdef0")
    assert iam_policy.allows(PURCHASE, "ec2:PurchaseCapacityBlock", block, {})
    assert iam_policy.actions(PURCHASE) == ["ec2:PurchaseCapacityBlock"]
