"""The exact AWS requests a deploy sends (botocore Stubber checks them against the service model).

Capacity reservations/blocks and the public /aws/service/neuron SSM parameter exist only here:
moto 5 has neither.
"""

from __future__ import annotations

import base64
import shlex
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import deploy_fixtures
import pytest
import yaml
from botocore.stub import ANY
from botocore.validate import ParamValidator
from deploy_fixtures import (
    INF2_CONFIG,
    INSTANCE_ID,
    OWNER_ARN,
    PINNED_PICK,
    REGION,
    TRN1_CONFIG,
    StubbedAws,
    dlami_images,
    instant_pacing,
    queue_bootstrap,
    queue_ping,
    queue_plan,
    queue_run_instances,
    queue_running,
)

from neuron_ssp.config import config_from_dict, load_config
from neuron_ssp.deploy import ami
from neuron_ssp.deploy.capacity import CapacityTarget, Reservation, check_reservation
from neuron_ssp.deploy.inventory import Deployment
from neuron_ssp.deploy.launch import execute_launch, prepare_launch
from neuron_ssp.deploy.launch_plan import LaunchOptions
from neuron_ssp.deploy.progress import Silent
from neuron_ssp.deploy.ssm_run import S3Location, bash_commands, run_remote
from neuron_ssp.deploy.userdata import BootstrapSpec, HfTokenSource, render
from neuron_ssp.errors import RuntimeProblem, UsageError

NOW = datetime(2025, 8, 1, 12, 0, tzinfo=timezone.utc)
TOKEN = "neuron-ssp-0123456789abcdef"
BLOCK = "cr-0123456789abcdef0"
QUIET = Silent()

# fixtures of this module (assigned, not imported, so test parameters may share their names)
aws_sandbox = deploy_fixtures.aws_sandbox
stub_session = deploy_fixtures.stub_session
stubbed = deploy_fixtures.stubbed


def block_reservation(**overrides: object) -> dict[str, object]:
    return {
        "CapacityReservationId": BLOCK,
        "InstanceType": "trn1.32xlarge",
        "AvailabilityZone": "us-east-1d",
        "State": "active",
        "AvailableInstanceCount": 1,
        "ReservationType": "capacity-block",
        "EndDate": NOW + timedelta(days=1),
        **overrides,
    }


def expected_tags(name: str, config: str, output: str | None = None) -> list[dict[str, object]]:
    tags = {
        "Name": name,
        "Project": "neuron-ssp",
        "neuron-ssp:deployment": name,
        "neuron-ssp:config": config,
        "neuron-ssp:owner": OWNER_ARN,
        "neuron-ssp:ttl-hours": "4",
        "neuron-ssp:expires-at": "2025-08-01T16:00:00Z",
    }
    if output:
        tags["neuron-ssp:output-s3-uri"] = output
    pairs = [{"Key": k, "Value": v} for k, v in tags.items()]
    return [{"ResourceType": "instance", "Tags": pairs}, {"ResourceType": "volume", "Tags": pairs}]


def test_capacity_block_launch_sends_the_exact_run_instances_request(stubbed: StubbedAws) -> None:
    options = LaunchOptions(
        region=REGION,
        name="trn1-block",
        instance_profile="neuron-ssp-instance",
        capacity=CapacityTarget(BLOCK, is_block=True),
        output_s3_uri="s3://out-bucket/runs",
    )
    queue_plan(stubbed, "trn1-block", reservation=block_reservation())
    queue_run_instances(
        stubbed,
        {
            "ImageId": PINNED_PICK,
            "InstanceType": "trn1.32xlarge",
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": TOKEN,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "BlockDeviceMappings": [
                {
                    "DeviceName": "/dev/sda1",
                    "Ebs": {
                        "VolumeSize": 512,
                        "VolumeType": "gp3",
                        "Iops": 4000,
                        "Throughput": 1000,
                        "Encrypted": True,
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "InstanceMetadataTags": "enabled"},
            "IamInstanceProfile": {"Name": "neuron-ssp-instance"},
            "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": BLOCK}},
            "InstanceMarketOptions": {"MarketType": "capacity-block"},
            "Placement": {"AvailabilityZone": "us-east-1d"},  # no subnet given: the block's AZ
            "TagSpecifications": expected_tags("trn1-block", "llama2-70b-7b-trn1-bf16", "s3://out-bucket/runs"),
            "UserData": ANY,
        },
    )
    queue_running(stubbed, state="pending")
    queue_running(stubbed)
    queue_ping(stubbed, None)  # the agent has not registered yet
    queue_ping(stubbed, "Online")
    queue_running(stubbed)
    queue_bootstrap(stubbed, "weights", "ready")  # launch returns only once the bootstrap says ready

    plan = prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW, client_token=TOKEN)
    deployment = execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)

    assert deployment.instance_id == INSTANCE_ID and deployment.hourly_usd == 21.50
    assert plan.in_capacity_block and plan.max_cost_usd is None  # prepaid: no on-demand worst case
    stubbed.assert_done()


def test_on_demand_request_uses_the_given_network_and_no_market_options(stubbed: StubbedAws) -> None:
    options = LaunchOptions(
        region=REGION,
        subnet_id="subnet-0abc",
        security_group_ids=("sg-01", "sg-02"),
        key_name="me",
        instance_profile="arn:aws:iam::123456789012:instance-profile/p",
        volume_gb=300,
        ttl_hours=2.5,
    )
    queue_plan(stubbed, "llama2-70b-7b-inf2-bf16")
    plan = prepare_launch(load_config(INF2_CONFIG), INF2_CONFIG, options, stubbed.clients, now=NOW)

    params = plan.params
    assert plan.name == "llama2-70b-7b-inf2-bf16" and params["InstanceType"] == "inf2.48xlarge"
    assert params["SubnetId"] == "subnet-0abc" and params["SecurityGroupIds"] == ["sg-01", "sg-02"]
    assert params["KeyName"] == "me"
    assert params["IamInstanceProfile"] == {"Arn": "arn:aws:iam::123456789012:instance-profile/p"}
    assert params["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 300
    assert "InstanceMarketOptions" not in params and "CapacityReservationSpecification" not in params
    assert params["ClientToken"].startswith("neuron-ssp-") and len(params["ClientToken"]) <= 64
    assert plan.hourly_usd == 12.98 and plan.max_cost_usd == pytest.approx(12.98 * 2.5)
    assert any("padded" in w for w in plan.warnings)  # the topology's warnings reach the user
    assert any("--weights-s3-uri" in w for w in plan.warnings)
    stubbed.assert_done()


def test_root_volume_is_encrypted_with_the_given_kms_key_and_fast_enough_for_the_weights(stubbed: StubbedAws) -> None:
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    queue_plan(stubbed, "x")
    options = LaunchOptions(region=REGION, kms_key=key)
    params = prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW).params
    (root,) = params["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["KmsKeyId"] == key
    assert root["Ebs"]["VolumeSize"] >= 512 and root["Ebs"]["Throughput"] == 1000 and root["Ebs"]["Iops"] == 4000
    assert root["Ebs"]["Throughput"] <= 0.25 * root["Ebs"]["Iops"]  # gp3: at most 0.25 MiB/s per IOPS
    # the whole request, as botocore's validator sees it against the EC2 service model
    ec2_model = stubbed.clients.ec2.meta.service_model.operation_model("RunInstances").input_shape
    report = ParamValidator().validate(params, ec2_model)
    assert not report.has_errors(), report.generate_report()
    stubbed.assert_done()


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({"volume_gb": 500}, "--volume-gb", "must be >= 512 on trn1.32xlarge"),
        ({"kms_key": "my key"}, "--kms-key", "not a KMS key id"),
    ],
)
def test_too_small_trn1_volume_and_bad_kms_key_are_refused(
    stubbed: StubbedAws, options: dict, field: str, rule: str
) -> None:
    with pytest.raises(UsageError) as raised:
        prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, LaunchOptions(region=REGION, **options), stubbed.clients)
    assert [(p.field, rule in p.rule) for p in raised.value.problems] == [(field, True)]
    stubbed.assert_done()  # refused before any AWS call


def test_capacity_reservation_targets_it_without_capacity_block_market(stubbed: StubbedAws) -> None:
    reservation = block_reservation(ReservationType="default")
    options = LaunchOptions(region=REGION, subnet_id="subnet-0abc", capacity=CapacityTarget(BLOCK, is_block=False))
    queue_plan(stubbed, "x", reservation=reservation)
    params = prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW).params
    assert params["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": BLOCK}}
    assert "InstanceMarketOptions" not in params and "Placement" not in params


@pytest.mark.parametrize(
    ("overrides", "is_block", "rule"),
    [
        ({"State": "scheduled"}, True, "not 'active'"),
        ({"InstanceType": "inf2.48xlarge"}, True, "the reservation is for inf2.48xlarge"),
        ({"AvailableInstanceCount": 0}, True, "no free instance slot"),
        ({}, False, "does not match the reservation's kind"),
    ],
)
def test_unusable_reservations_are_refused_before_launch(
    stubbed: StubbedAws, overrides: dict, is_block: bool, rule: str
) -> None:
    queue_plan(stubbed, "x", reservation=block_reservation(**overrides))
    stubbed.sts.deactivate()  # planning stops at the reservation
    options = LaunchOptions(region=REGION, capacity=CapacityTarget(BLOCK, is_block=is_block))
    with pytest.raises(UsageError) as raised:
        prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW)
    assert any(rule in p.rule for p in raised.value.problems)


def test_block_ending_before_the_ttl_is_a_warning(stubbed: StubbedAws) -> None:
    queue_plan(stubbed, "x", reservation=block_reservation(EndDate=NOW + timedelta(hours=1)))
    options = LaunchOptions(region=REGION, capacity=CapacityTarget(BLOCK, is_block=True))
    plan = prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW)
    assert any("before the TTL" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("kind", "end_in", "warning"),
    [
        # a block terminates its instances from 30 min before its end: 4 h 15 min is too short for a 4 h TTL
        (
            "capacity-block",
            timedelta(hours=4, minutes=15),
            "AWS starts terminating its instances 30 minutes earlier, at 2025-08-01 15:45 UTC",
        ),
        ("capacity-block", timedelta(hours=4, minutes=30), None),
        # an On-Demand Capacity Reservation's end leaves the instance running, billed On-Demand
        ("default", timedelta(hours=3), "keeps running after it, billed at the On-Demand rate"),
        ("default", timedelta(hours=4, minutes=15), None),
    ],
)
def test_reservation_end_warning_says_what_each_kind_does(kind: str, end_in: timedelta, warning: str | None) -> None:
    reservation = Reservation(BLOCK, "trn1.32xlarge", "us-east-1d", "active", 1, kind == "capacity-block", NOW + end_in)
    target = CapacityTarget(BLOCK, is_block=reservation.is_block)
    warnings = check_reservation(reservation, target, "trn1.32xlarge", NOW + timedelta(hours=4))
    if warning is None:
        assert warnings == []
    else:
        (text,) = warnings
        assert warning in text and "terminate the instance then" not in text


# ---------------------------------------------------------------- DLAMI


def test_pinned_dlami_is_chosen_by_sdk_description_not_by_date(stubbed: StubbedAws) -> None:
    stubbed.ec2.add_response(
        "describe_images",
        dlami_images(),
        {
            "Owners": ["amazon"],
            "IncludeDeprecated": True,
            "Filters": [
                {"Name": "name", "Values": ["Deep Learning AMI Neuron (Ubuntu 22.04) *"]},
                {"Name": "description", "Values": ["*Neuron SDK 2.25*"]},
                {"Name": "architecture", "Values": ["x86_64"]},
                {"Name": "state", "Values": ["available"]},
            ],
        },
    )
    chosen = ami.resolve_ami("pinned", stubbed.clients.ec2, stubbed.clients.ssm, REGION)
    # the SDK 2.25 image rebuilt on 2025-10-20, after SDK 2.26 shipped: a date window would miss it
    assert chosen.image_id == PINNED_PICK and chosen.source == "pinned Neuron SDK 2.25"


@pytest.mark.parametrize(
    ("name", "description", "accepted"),
    [
        ("Deep Learning AMI Neuron (Ubuntu 22.04) 20250801", "... Neuron SDK 2.25.0, multi-framework", True),
        ("Deep Learning AMI Neuron (Ubuntu 22.04) 20251020", "... Neuron SDK 2.25.1 ...", True),
        ("Deep Learning AMI Neuron (Ubuntu 22.04) 20250918", "... Neuron SDK 2.26.0 ...", False),
        ("Deep Learning AMI Neuron (Ubuntu 22.04) 20250625", "... Neuron SDK 2.24.0 ...", False),
        ("Deep Learning AMI Neuron (Ubuntu 22.04) 20990101", "... Neuron SDK 2.250 ...", False),
        ("Deep Learning AMI Neuron PyTorch 2.7 (Ubuntu 22.04) 20250801", "... Neuron SDK 2.25.0 ...", False),
    ],
)
def test_pin_accepts_only_the_multi_framework_dlami_of_sdk_2_25(name: str, description: str, accepted: bool) -> None:
    assert ami.PINNED.accepts({"Name": name, "Description": description}) is accepted


def test_no_pinned_dlami_in_region_says_what_to_do(stubbed: StubbedAws) -> None:
    stubbed.ec2.add_response("describe_images", {"Images": []}, None)
    with pytest.raises(RuntimeProblem) as raised:
        ami.resolve_ami("pinned", stubbed.clients.ec2, stubbed.clients.ssm, "ap-south-2")
    assert "--ami ami-" in raised.value.problems[0].fix


def test_latest_dlami_comes_from_the_public_ssm_parameter(stubbed: StubbedAws) -> None:
    stubbed.ssm.add_response(
        "get_parameter",
        {"Parameter": {"Name": ami.LATEST_PARAMETER, "Value": "ami-0latest"}},
        {"Name": "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id"},
    )
    stubbed.ec2.add_response(
        "describe_images",
        {"Images": [{"ImageId": "ami-0latest", "Name": "DLAMI latest"}]},
        {"ImageIds": ["ami-0latest"], "IncludeDeprecated": True},
    )
    assert ami.resolve_ami("latest", stubbed.clients.ec2, stubbed.clients.ssm, REGION).image_id == "ami-0latest"


# ---------------------------------------------------------------- refused before anything is created


def write_config(tmp_path: Path, **sections: dict) -> Path:
    data = {
        "name": "t",
        "platform": {"backend": "neuron", "instance_type": "trn1.32xlarge"},
        "target": {"path": "/opt/models/Llama-2-70b-hf", "dtype": "bf16", "tp_degree": 32},
        "draft": {"path": "/opt/models/Llama-2-7b-hf", "dtype": "bf16", "tp_degree": 32},
        "speculation": {"drafter": "model", "k": 4},
        **sections,
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"platform": {"backend": "torch"}}, "platform"),
        ({"target": {"path": "/opt/models/Llama-2-70b-hf", "dtype": "bf16", "tp_degree": 7}}, "target.tp_degree"),
    ],
)
def test_invalid_configs_are_refused_before_any_aws_call(
    stubbed: StubbedAws, tmp_path: Path, sections: dict, field: str
) -> None:
    path = write_config(tmp_path, **sections)
    with pytest.raises(UsageError) as raised:
        prepare_launch(load_config(path), path, LaunchOptions(region=REGION), stubbed.clients)
    assert any(p.field.startswith(field) for p in raised.value.problems)
    stubbed.assert_done()  # nothing was queued and nothing was called


def test_bad_flags_are_all_reported_at_once(stubbed: StubbedAws, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    options = LaunchOptions(
        region=REGION, ttl_hours=0, volume_gb=20, weights_s3_uri="bucket/models", output_s3_uri="s3://out-bucket/runs"
    )
    with pytest.raises(UsageError) as raised:
        prepare_launch(load_config(path), path, options, stubbed.clients)
    fields = [p.field for p in raised.value.problems]
    assert fields == ["--ttl-hours", "--volume-gb", "--weights-s3-uri", "--output-s3-uri"]


# ---------------------------------------------------------------- user data and remote commands


def spec(**overrides: object) -> BootstrapSpec:
    config = load_config(TRN1_CONFIG)
    values = {
        "deployment": "trn1-test",
        "region": REGION,
        "config_yaml": yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
        "model_paths": ("/opt/models/Llama-2-70b-hf", "/opt/models/Llama-2-7b-hf"),
        "expires_at": NOW + timedelta(hours=4),
        "package_spec": "neuron-ssp==0.1.0",
        "weights_s3_uri": "s3://weights/models/",
        "hf_token": HfTokenSource("secretsmanager", "neuron-ssp/hf-token"),
        **overrides,
    }
    return BootstrapSpec(**values)  # type: ignore[arg-type]


def test_user_data_is_valid_bash_with_ttl_venv_weights_and_no_secret() -> None:
    script = render(spec())
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "echo 2025-08-01T16:00:00Z > /var/lib/neuron-ssp/expires-at" in script
    expiry = script.index("systemctl enable --now neuron-ssp-expiry.timer")
    assert expiry < script.index("source /opt/aws_neuronx_venv_pytorch_2_7_transformers")  # before it can fail
    assert "aws s3 sync --only-show-errors s3://weights/models/Llama-2-70b-hf/ /opt/models/Llama-2-70b-hf" in script
    assert "aws s3 sync --only-show-errors s3://weights/models/Llama-2-7b-hf/ /opt/models/Llama-2-7b-hf" in script
    assert "secretsmanager get-secret-value --secret-id neuron-ssp/hf-token" in script
    assert "--extra-index-url https://pip.repos.neuron.amazonaws.com" in script
    assert "{{" not in script


def test_user_data_carries_the_validated_config_verbatim() -> None:
    script = render(spec())
    encoded = next(line.split()[1] for line in script.splitlines() if line.startswith("echo ") and "base64 -d" in line)
    config = config_from_dict(yaml.safe_load(base64.b64decode(encoded)))
    assert config == load_config(TRN1_CONFIG)


def test_user_data_with_ssm_token_and_without_weights() -> None:
    script = render(spec(weights_s3_uri=None, hf_token=HfTokenSource("ssm", "/neuron-ssp/hf")))
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "aws ssm get-parameter --name /neuron-ssp/hf --with-decryption" in script
    assert "s3 sync" not in script and "test -d /opt/models/Llama-2-70b-hf" in script


HF_TOKEN = "hf_" + "Zq7Lm2Xv9Rt4Wb8Nc3Kd6Pf1Hs5Jy0Ga4Ue"  # the shape of a real token, valid for nothing
GITHUB_TOKEN = "ghp_" + "Zq7Lm2Xv9Rt4Wb8Nc3Kd6Pf1Hs5Jy0Ga4UeXy"  # likewise: 36 characters after ghp_


def decoded_user_data(script: str) -> str:
    """The script plus the config it carries base64-encoded: a secret could hide in either."""
    encoded = next(line.split()[1] for line in script.splitlines() if line.startswith("echo ") and "base64 -d" in line)
    return script + base64.b64decode(encoded).decode()


def test_a_real_token_in_the_environment_never_reaches_user_data(
    stubbed: StubbedAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", HF_TOKEN)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache/huggingface").mkdir(parents=True)
    (tmp_path / ".cache/huggingface/token").write_text(HF_TOKEN)
    queue_plan(stubbed, "x")
    options = LaunchOptions(
        region=REGION, instance_profile="p", hf_token=HfTokenSource("secretsmanager", "neuron-ssp/hf")
    )
    user_data = decoded_user_data(
        prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, stubbed.clients, now=NOW).params["UserData"]
    )
    assert "--secret-id neuron-ssp/hf" in user_data  # the token's source went through the render path ...
    assert HF_TOKEN not in user_data and HF_TOKEN[3:] not in user_data  # ... the token itself did not


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"config_yaml": f"name: team-{HF_TOKEN}\n"}, "config"),
        ({"config_yaml": "neuron:\n  compile_cache_url: https://bob:s3cr3t@cache.example.com/neuron\n"}, "config"),
        ({"package_spec": f"git+https://x-token:{HF_TOKEN}@github.com/me/neuron-ssp"}, "--package-spec"),
        # a token alone as the URL's user name: no password part, still a credential
        ({"package_spec": f"git+https://{GITHUB_TOKEN}@github.com/me/neuron-ssp"}, "--package-spec"),
        ({"package_spec": "git+https://deploy-bot@github.com/me/neuron-ssp"}, "--package-spec"),
        ({"config_yaml": f"name: t\n# {GITHUB_TOKEN}\n"}, "config"),
        ({"config_yaml": "name: t\n# github_pat_11ABCDEFG0123456789abcdef_0123456789ABCDEFabcdef\n"}, "config"),
        ({"weights_s3_uri": "s3://weights/glpat-Zq7Lm2Xv9Rt4Wb8Nc3Kd/"}, "--weights-s3-uri"),
    ],
)
def test_a_credential_in_what_goes_into_user_data_is_refused_without_echoing_it(overrides: dict, field: str) -> None:
    with pytest.raises(UsageError) as raised:
        render(spec(**overrides))
    assert field in [p.field for p in raised.value.problems]
    assert HF_TOKEN not in str(raised.value) and "s3cr3t" not in str(raised.value)
    assert GITHUB_TOKEN not in str(raised.value)


def test_plain_urls_and_s3_uris_are_not_taken_for_credentials() -> None:
    script = render(spec(package_spec="git+https://github.com/me/neuron-ssp@v0.1.0", weights_s3_uri="s3://w/m/"))
    assert "github.com/me/neuron-ssp@v0.1.0" in script


def test_oversized_user_data_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        render(spec(config_yaml="# padding\n" * 3000))


def test_remote_command_keeps_every_argument_verbatim() -> None:
    argv = ["printf", "%s|", "two words", "$(touch /tmp/pwned)", "a'b", "; rm -rf /"]
    (command,) = bash_commands(argv, require_ready=False)
    ran = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert ran.stdout == "two words|$(touch /tmp/pwned)|a'b|; rm -rf /|"
    ready_check = bash_commands(["neuron-ssp", "bench"])[0]
    assert "/var/lib/neuron-ssp/status" in ready_check and ". /opt/neuron-ssp/env.sh" in ready_check
    assert shlex.split(shlex.split(ready_check)[-1])[-2:] == ["neuron-ssp", "bench"]


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://out-bucket/runs/", "out-bucket", "runs"),
        ("s3://out-bucket", "out-bucket", ""),
        ("s3://a.b-c/x/y", "a.b-c", "x/y"),
    ],
)
def test_output_location_parsing(uri: str, bucket: str, prefix: str) -> None:
    location = S3Location.parse(uri)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert location.key_prefix("cmd", "i-1") == "/".join(p for p in (prefix, "cmd", "i-1") if p) + "/"


def test_cancelling_is_waited_through_until_the_command_is_cancelled(stubbed: StubbedAws) -> None:
    command_id = "22222222-2222-4222-8222-222222222222"
    deployment = Deployment("trn1", INSTANCE_ID, "trn1.32xlarge", "running", REGION, "us-east-1a", NOW, {})
    stubbed.ssm.add_response("send_command", {"Command": {"CommandId": command_id}}, None)
    for status in ("InProgress", "Cancelling", "Cancelled"):
        stubbed.ssm.add_response(
            "get_command_invocation",
            {"Status": status, "ResponseCode": -1},
            {"CommandId": command_id, "InstanceId": INSTANCE_ID},
        )
    result = run_remote(
        stubbed.clients.ssm,
        stubbed.clients.s3,
        deployment,
        bash_commands(["true"]),
        output=None,
        timeout_s=60,
        pacing=instant_pacing(),
        progress=QUIET,
        what="run",
    )
    assert result.status == "Cancelled"
    stubbed.assert_done()


def test_logs_console_help_says_console_output() -> None:
    from click.testing import CliRunner

    from neuron_ssp.cli import main

    result = CliRunner().invoke(main, ["deploy", "logs", "--help"], terminal_width=200)
    line = next(line for line in result.output.splitlines() if "--console" in line)
    assert "console output" in line and "serial" not in line


def test_bad_output_uri_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        S3Location.parse("https://bucket/x")


# ---------------------------------------------------------------- sandbox and optional extra


def test_sandbox_refuses_requests_to_real_aws() -> None:
    import boto3

    client = boto3.client("sts", region_name=REGION)  # default endpoint: sts.us-east-1.amazonaws.com
    with pytest.raises(pytest.fail.Exception, match="only the loopback"):
        client.get_caller_identity()


def test_missing_boto3_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from neuron_ssp.cli import main

    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "botocore", None)
    result = CliRunner().invoke(main, ["deploy", "list", "--region", REGION])
    assert result.exit_code == 2 and "pip install 'neuron-ssp[deploy]'" in result.output


def test_the_cli_imports_without_boto3() -> None:
    """boto3 is an optional extra: only running a deploy command may need it."""
    modules = "neuron_ssp.cli.deploy, neuron_ssp.deploy.launch, neuron_ssp.deploy.ssm_run, neuron_ssp.deploy.teardown"
    code = f"import sys; sys.modules['boto3'] = sys.modules['botocore'] = None; import {modules}"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_deploy_library_imports_without_rich() -> None:
    """Printing is the CLI's job: every module of neuron_ssp.deploy reports progress through a callback."""
    import pkgutil

    import neuron_ssp.deploy

    names = [m.name for m in pkgutil.walk_packages(neuron_ssp.deploy.__path__, "neuron_ssp.deploy.")]
    assert "neuron_ssp.deploy.launch" in names and "neuron_ssp.deploy.sagemaker.create" in names
    code = f"import sys; sys.modules['rich'] = None; import {', '.join(names)}"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_planning_is_pure_given_the_looked_up_facts() -> None:
    """The same facts give the same request, with no AWS client in reach."""
    from neuron_ssp.deploy.ami import Ami
    from neuron_ssp.deploy.launch_plan import LaunchFacts, plan_launch

    facts = LaunchFacts(REGION, Ami(PINNED_PICK, "DLAMI", "2025-10-20", "/dev/sda1", "pinned"), OWNER_ARN)
    options = LaunchOptions(region=REGION, name="pure", instance_profile="p")
    plans = [
        plan_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, options, facts, now=NOW, client_token=TOKEN)
        for _ in range(2)
    ]
    assert plans[0] == plans[1] and plans[0].params["ImageId"] == PINNED_PICK
    assert plans[0].expires_at == NOW + timedelta(hours=4) and plans[0].client_token == TOKEN
