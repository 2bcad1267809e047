"""launch -> status -> run -> list -> teardown through the CLI, against a moto server on 127.0.0.1.

Real boto3 clients talk HTTP to moto. Stubbed because moto 5 cannot do them (see deploy_fixtures):
the Neuron DLAMIs are seeded into moto's AMI catalog, `DescribeInstanceInformation` is answered
"Online" by a botocore hook, and a fake SSM agent produces command output and uploads it to moto's S3.
"""

from __future__ import annotations

import json
import shlex
from datetime import datetime, timedelta, timezone
from pathlib import Path

import deploy_fixtures
import iam_policy
import pytest
from aws_authorization import authorizations
from click.testing import CliRunner
from deploy_fixtures import (
    PINNED_PICK,
    REGION,
    TRN1_CONFIG,
    FakeSsmAgent,
    create_instance_profile,
    instant_pacing,
    moto_client,
)

from neuron_ssp.cli import deploy as deploy_cli
from neuron_ssp.cli import main

OUT_BUCKET = "neuron-ssp-test-out"

# fixtures of this module (assigned, not imported, so test parameters may share their names)
aws_sandbox = deploy_fixtures.aws_sandbox
moto = deploy_fixtures.moto
moto_endpoint = deploy_fixtures.moto_endpoint
moto_session = deploy_fixtures.moto_session


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy_cli, "PACING", instant_pacing())


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["deploy", *args], catch_exceptions=False)
    return result.exit_code, result.output


def launch_args(name: str, *extra: str) -> list[str]:
    return [
        "launch",
        str(TRN1_CONFIG),
        "--region",
        REGION,
        "--name",
        name,
        "--instance-profile",
        "neuron-ssp-instance",
        "--output-s3-uri",
        f"s3://{OUT_BUCKET}/runs",
        "--weights-s3-uri",
        "s3://neuron-ssp-test-weights/models",
        *extra,
    ]


def test_launch_status_run_list_teardown(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    moto_client("s3").create_bucket(Bucket=OUT_BUCKET)
    long_output = "".join(f"token {i}\n" for i in range(4000)) + "END-OF-BENCH\n"  # > 24,000 chars

    def agent(script: str) -> tuple[str, int]:
        if "neuron-ssp bench" in script:
            return long_output, 0
        if "tail -n 50 /var/log/neuron-ssp-bootstrap.log" in script:
            return "[neuron-ssp] ready\n", 0
        return "ready\n", 0

    moto.respond = agent

    code, out = cli(*launch_args("it-trn1", "--yes"))
    assert code == 0, out
    assert PINNED_PICK in out and "$21.50/h" in out and "running:" in out

    ec2 = moto_client("ec2")
    found = ec2.describe_instances(Filters=[{"Name": "tag:neuron-ssp:deployment", "Values": ["it-trn1"]}])
    (inst,) = [i for r in found["Reservations"] for i in r["Instances"]]
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert inst["InstanceType"] == "trn1.32xlarge" and inst["ImageId"] == PINNED_PICK
    assert tags["Project"] == "neuron-ssp" and tags["neuron-ssp:config"] == "llama2-70b-7b-trn1-bf16"
    assert tags["neuron-ssp:ttl-hours"] == "4" and tags["neuron-ssp:owner"].startswith("arn:aws:")
    assert tags["neuron-ssp:output-s3-uri"] == f"s3://{OUT_BUCKET}/runs"
    shutdown = ec2.describe_instance_attribute(
        InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    attached = [{"Name": "attachment.instance-id", "Values": [inst["InstanceId"]]}]
    (root,) = ec2.describe_volumes(Filters=attached)["Volumes"]
    assert root["Encrypted"] and root["Size"] == 512 and root["VolumeType"] == "gp3"

    code, out = cli("status", "it-trn1", "--region", REGION, "--json")
    assert code == 0, out
    status = json.loads(out[out.index("{") :])
    assert status["state"] == "running" and status["ssm"] == "Online" and status["bootstrap"] == "ready"
    assert status["usd_per_hour"] == 21.5

    code, out = cli(
        "run", "it-trn1", "--region", REGION, "--", "neuron-ssp", "bench", "--config", "/opt/neuron-ssp/config.yaml"
    )
    assert code == 0, out
    assert "END-OF-BENCH" in out and "token 3999" in out  # past the 24,000 chars SSM keeps inline
    sent = moto.sent[-1]
    assert sent["DocumentName"] == "AWS-RunShellScript"
    assert sent["OutputS3BucketName"] == OUT_BUCKET and sent["OutputS3KeyPrefix"] == "runs"
    script = sent["Parameters"]["commands"][0]
    assert shlex.join(["neuron-ssp", "bench", "--config", "/opt/neuron-ssp/config.yaml"]) in shlex.split(script)[-1]

    code, out = cli("extend", "it-trn1", "--region", REGION, "--hours", "10")
    assert code == 0 and "now terminates itself at" in out, out
    tags = {
        t["Key"]: t["Value"]
        for t in ec2.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0]["Instances"][0]["Tags"]
    }
    expires = datetime.strptime(tags["neuron-ssp:expires-at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert timedelta(hours=9.9) < expires - datetime.now(timezone.utc) <= timedelta(hours=10)
    assert tags["Project"] == "neuron-ssp"  # only the expiry was retagged
    assert cli("extend", "it-trn1", "--region", REGION, "--hours", "200")[0] == 2

    code, out = cli("logs", "it-trn1", "--region", REGION, "--lines", "50")
    assert code == 0 and "[neuron-ssp] ready" in out
    assert cli("logs", "it-trn1", "--region", REGION, "--console")[0] == 0

    code, out = cli("list", "--region", REGION, "--json")
    listed = json.loads(out)
    assert [d["name"] for d in listed] == ["it-trn1"] and listed[0]["usd_so_far"] is not None
    table = CliRunner().invoke(main, ["deploy", "list", "--region", REGION], env={"COLUMNS": "80"}).output
    assert "it-trn1" in table and "trn1.32xlarge" in table and "…" not in table, table  # reads at 80 columns

    code, out = cli("teardown", "it-trn1", "--region", REGION, "--yes")
    assert code == 0, out
    assert "terminated" in out
    state = ec2.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "terminated"
    assert json.loads(cli("list", "--region", REGION, "--json")[1]) == []

    # every request sent above is allowed, on its resources and under its conditions, by the least-privilege
    # policy the error messages point at (its bucket placeholder filled in as the README says)
    assert {
        "ec2:RunInstances",
        "ec2:DescribeImages",
        "ssm:SendCommand",
        "s3:GetObject",
        "ec2:CreateTags",
        "ec2:TerminateInstances",
    } <= moto.actions
    assert_policy_allows_every_request(moto, {"REPLACE-WITH-OUTPUT-BUCKET": OUT_BUCKET})


def assert_policy_allows_every_request(agent: FakeSsmAgent, placeholders: dict[str, str]) -> None:
    policy = iam_policy.load(
        Path(__file__).resolve().parents[1] / "deploy" / "iam" / "operator-policy.json", placeholders
    )
    ec2 = moto_client("ec2")

    def tags_of(instance_arn: str) -> dict[str, str]:
        found = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_arn.rsplit("/", 1)[1]]}])
        return {t["Key"]: t["Value"] for t in found["Tags"]}

    for service, operation, params in agent.requests:
        for action, resource, context in authorizations(service, operation, params, tags_of=tags_of):
            assert iam_policy.allows(policy, action, resource, context), (operation, action, resource, context)


def test_run_reports_a_failed_remote_command(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    moto_client("s3").create_bucket(Bucket=OUT_BUCKET)
    assert cli(*launch_args("it-fail", "--yes"))[0] == 0
    moto.respond = lambda script: ("Traceback: model missing\n", 2)

    code, out = cli("run", "it-fail", "--region", REGION, "--", "neuron-ssp", "bench")
    assert code == 1
    assert "model missing" in out and "exit code 2" in out and "Traceback (most recent" not in out


def test_dry_run_uses_ec2_dryrun_and_creates_nothing(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    code, out = cli(*launch_args("it-dry", "--dry-run"))
    assert_policy_allows_every_request(moto, {})
    assert code == 0, out
    assert "allowed" in out and "nothing was created" in out
    assert moto_client("ec2").describe_instances()["Reservations"] == []


def test_second_launch_with_the_same_name_is_refused(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    assert cli(*launch_args("it-twice", "--yes"))[0] == 0
    code, out = cli(*launch_args("it-twice", "--yes"))
    assert code == 2 and "a deployment of that name is live" in out


def test_declining_the_prompt_launches_nothing(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    result = CliRunner().invoke(main, ["deploy", *launch_args("it-no")], input="n\n")
    assert result.exit_code == 0 and "nothing was created" in result.output
    assert moto_client("ec2").describe_instances()["Reservations"] == []


def test_teardown_all_and_unknown_names(moto: FakeSsmAgent) -> None:
    create_instance_profile()
    assert cli(*launch_args("it-a", "--yes"))[0] == 0
    assert cli(*launch_args("it-b", "--yes"))[0] == 0
    for command in ("status", "teardown"):
        code, out = cli(command, "it-c", "--region", REGION)
        assert code == 2 and "use one of: it-a, it-b" in out
    code, out = cli("teardown", "--all", "--region", REGION, "--yes", "--no-wait")
    assert code == 0 and "it-a" in out and "it-b" in out
    code, out = cli("teardown", "--region", REGION)
    assert code == 2 and "NAME or --all" in out
