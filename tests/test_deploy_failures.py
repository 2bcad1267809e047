"""Every way a launch can fail, and that nothing is left running (or that we say exactly what is).

botocore Stubber answers each call; a call the test did not queue fails the test, so "no terminate
was sent" and "terminate was sent for this id" are both checked by the queue.
"""

from __future__ import annotations

from datetime import datetime, timezone

import deploy_fixtures
import pytest
from botocore.stub import ANY
from click.testing import CliRunner
from deploy_fixtures import (
    INSTANCE_ID,
    REGION,
    TRN1_CONFIG,
    FakeClock,
    StubbedAws,
    instance,
    instant_pacing,
    queue_bootstrap,
    queue_ping,
    queue_plan,
    queue_run_instances,
    queue_running,
    queue_terminate,
    reservations,
)

from neuron_ssp.cli import deploy as deploy_cli
from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.deploy import launch
from neuron_ssp.deploy.aws import AwsClients
from neuron_ssp.deploy.errors import translate
from neuron_ssp.deploy.launch import check_permissions, execute_launch, prepare_launch
from neuron_ssp.deploy.launch_plan import LaunchOptions, LaunchPlan
from neuron_ssp.deploy.progress import Silent
from neuron_ssp.deploy.waiting import Pacing
from neuron_ssp.errors import RuntimeProblem, UsageError

NOW = datetime(2025, 8, 1, 12, 0, tzinfo=timezone.utc)
QUIET = Silent()

# fixtures of this module (assigned, not imported, so test parameters may share their names)
aws_sandbox = deploy_fixtures.aws_sandbox
stub_session = deploy_fixtures.stub_session
stubbed = deploy_fixtures.stubbed


def planned(stubbed: StubbedAws, **options: object) -> LaunchPlan:
    queue_plan(stubbed, "trn1")
    opts = LaunchOptions(region=REGION, name="trn1", instance_profile="neuron-ssp-instance", **options)  # type: ignore[arg-type]
    return prepare_launch(load_config(TRN1_CONFIG), TRN1_CONFIG, opts, stubbed.clients, now=NOW, client_token="tok-1")


def interrupting_pacing() -> Pacing:
    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    return Pacing(interval_s=10, sleep=ctrl_c, clock=FakeClock())


def fields(exc: BaseException) -> list[str]:
    return [p.field for p in exc.problems]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- refused by AWS: nothing exists


def test_insufficient_capacity_suggests_another_az_or_a_capacity_block(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    stubbed.ec2.add_client_error(
        "run_instances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient trn1.32xlarge capacity in us-east-1a.",
    )
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    (problem,) = raised.value.problems
    assert problem.field == "instance_type" and problem.value == "trn1.32xlarge"
    assert "Availability Zone" in problem.fix and "--capacity-block-id" in problem.fix
    assert "describe-instance-type-offerings" in problem.fix
    stubbed.assert_done()  # no terminate: nothing was created


def test_unauthorized_names_the_permission_and_the_policy_file(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    stubbed.ec2.add_client_error(
        "run_instances",
        "UnauthorizedOperation",
        "You are not authorized to perform this operation. Encoded authorization failure message: abc123",
    )
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    (problem,) = raised.value.problems
    assert problem.field == "permissions" and problem.value == "ec2:RunInstances"
    assert "iam:PassRole" in problem.rule and "ec2:CreateTags" in problem.rule
    assert "deploy/iam/operator-policy.json" in problem.fix and "decode-authorization-message" in problem.fix


@pytest.mark.parametrize(
    ("code", "kind", "field"),
    [
        ("InvalidSubnetID.NotFound", UsageError, "--subnet-id"),
        ("InvalidGroup.NotFound", UsageError, "--security-group-id"),
        ("InvalidKeyPair.NotFound", UsageError, "--key-name"),
        ("InvalidCapacityReservationId.NotFound", UsageError, "--capacity-reservation-id/--capacity-block-id"),
        ("VcpuLimitExceeded", RuntimeProblem, "service quota"),
        ("ExpiredToken", UsageError, "aws credentials"),
        ("AccessDenied", RuntimeProblem, "permissions"),
        ("SomethingNew", RuntimeProblem, "ec2:RunInstances"),
    ],
)
def test_aws_error_codes_become_problems(stubbed: StubbedAws, code: str, kind: type, field: str) -> None:
    plan = planned(stubbed)
    stubbed.ec2.add_client_error("run_instances", code, "message from AWS")
    with pytest.raises(kind) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    assert fields(raised.value) == [field]


def test_missing_credentials_and_unreachable_endpoints() -> None:
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    assert isinstance(translate(NoCredentialsError(), "ec2"), UsageError)
    unreachable = translate(EndpointConnectionError(endpoint_url="https://ec2.x.amazonaws.com"), "ec2")
    assert isinstance(unreachable, RuntimeProblem) and "could not be reached" in unreachable.problems[0].rule


# ---------------------------------------------------------------- failing after the instance exists


def test_failure_half_way_terminates_the_instance(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_run_instances(stubbed)
    queue_running(stubbed)
    for _ in range(91):  # 900 s of fake time at 10 s per poll: SSM never sees the instance
        queue_ping(stubbed, None)
    queue_terminate(stubbed)

    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)

    timeout, cleanup = raised.value.problems
    assert "online in SSM" in timeout.field and "AmazonSSMManagedInstanceCore" in timeout.fix
    assert cleanup.value == INSTANCE_ID and "terminated" in cleanup.rule and "nothing is left running" in cleanup.rule
    stubbed.assert_done()


def test_instance_not_yet_visible_is_waited_for(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_run_instances(stubbed)
    stubbed.ec2.add_client_error(
        "describe_instances",
        "InvalidInstanceID.NotFound",
        "eventual consistency",
        expected_params={"InstanceIds": [INSTANCE_ID]},
    )
    queue_running(stubbed)
    queue_ping(stubbed)
    queue_running(stubbed)
    queue_bootstrap(stubbed, "ready")
    assert execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET).state == "running"
    stubbed.assert_done()


def test_instance_dying_while_starting_reports_the_reason(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_run_instances(stubbed)
    queue_running(
        stubbed,
        state="terminated",
        StateReason={"Code": "Server.InsufficientInstanceCapacity", "Message": "Insufficient capacity."},
    )
    queue_terminate(stubbed)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    assert "Insufficient capacity." in raised.value.problems[0].rule
    stubbed.assert_done()


LOG_LINE = "fatal error: An error occurred (AccessDenied) when calling the ListObjectsV2 operation"


def queue_failed_bootstrap(stubs: StubbedAws) -> None:
    """The instance comes up, SSM sees it, the bootstrap fails copying weights; then its log is read."""
    queue_run_instances(stubs)
    queue_running(stubs)
    queue_ping(stubs)
    queue_running(stubs)
    queue_bootstrap(stubs, "install", "weights", "failed: weights")
    log_command = "11111111-1111-4111-8111-111111111111"
    stubs.ssm.add_response(
        "send_command",
        {"Command": {"CommandId": log_command}},
        {
            "InstanceIds": [INSTANCE_ID],
            "DocumentName": "AWS-RunShellScript",
            "Parameters": ANY,
            "TimeoutSeconds": 600,
            "Comment": "neuron-ssp bootstrap log",
        },
    )
    stubs.ssm.add_response(
        "get_command_invocation",
        {
            "Status": "Success",
            "ResponseCode": 0,
            "StandardOutputContent": f"[neuron-ssp] 2025-08-01T12:09:00Z weights\n{LOG_LINE}\n"
            "[neuron-ssp] bootstrap FAILED at step: weights\n",
        },
        {"CommandId": log_command, "InstanceId": INSTANCE_ID},
    )


def test_a_failed_bootstrap_is_shown_with_its_log_tail_and_torn_down(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_failed_bootstrap(stubbed)
    queue_terminate(stubbed)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    failed, cleanup = raised.value.problems
    assert failed.field == "bootstrap" and failed.value == "weights"
    assert LOG_LINE in failed.rule and "/var/log/neuron-ssp-bootstrap.log" in failed.rule
    assert cleanup.value == INSTANCE_ID and "nothing is left running" in cleanup.rule
    stubbed.assert_done()


def test_a_failed_bootstrap_kept_for_debugging_says_when_it_terminates_itself(stubbed: StubbedAws) -> None:
    plan = planned(stubbed, keep_on_failure=True)
    queue_failed_bootstrap(stubbed)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    kept = raised.value.problems[-1]
    assert "still running" in kept.rule and "15 min after a failed bootstrap" in kept.rule
    assert "at the latest at 2025-08-01 16:00 UTC" in kept.rule and "deploy extend trn1 --hours N" in kept.rule
    stubbed.assert_done()  # and no terminate_instances was sent


def test_keep_on_failure_says_exactly_what_is_still_costing(stubbed: StubbedAws) -> None:
    plan = planned(stubbed, keep_on_failure=True)
    queue_run_instances(stubbed)
    stubbed.ec2.add_client_error(
        "describe_instances", "UnauthorizedOperation", "not allowed", expected_params={"InstanceIds": [INSTANCE_ID]}
    )

    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)

    kept = raised.value.problems[-1]
    assert kept.value == INSTANCE_ID
    assert "trn1.32xlarge in us-east-1 at $21.50/h" in kept.rule and "still running" in kept.rule
    assert "neuron-ssp deploy teardown trn1 --region us-east-1" in kept.fix
    stubbed.assert_done()  # and no terminate_instances was sent


def test_ctrl_c_while_waiting_terminates_the_instance(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_run_instances(stubbed)
    queue_running(stubbed, state="pending")
    queue_terminate(stubbed)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=interrupting_pacing(), progress=QUIET)
    interrupted, cleanup = raised.value.problems
    assert interrupted.value == "Ctrl-C" and "terminated" in cleanup.rule
    stubbed.assert_done()


def interrupt_run_instances(stubbed: StubbedAws) -> None:
    """Ctrl-C after AWS got the request, before we read the answer (the instance id is unknown)."""

    def interrupt(**_: object) -> None:
        raise KeyboardInterrupt

    queue_run_instances(stubbed)
    stubbed.clients.ec2.meta.events.register("after-call.ec2.RunInstances", interrupt)


def test_ctrl_c_during_run_instances_finds_the_instance_by_client_token(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    interrupt_run_instances(stubbed)
    stubbed.ec2.add_response(
        "describe_instances",
        reservations(instance(state="pending")),
        {"Filters": [{"Name": "client-token", "Values": ["tok-1"]}]},
    )
    queue_terminate(stubbed)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    assert raised.value.problems[-1].value == INSTANCE_ID and "terminated" in raised.value.problems[-1].rule
    stubbed.assert_done()


TOKEN_FILTER = {"Filters": [{"Name": "client-token", "Values": ["tok-1"]}]}


def test_ctrl_c_when_aws_created_nothing_says_so(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    interrupt_run_instances(stubbed)
    for _ in launch.CLIENT_TOKEN_BACKOFF_S:  # EC2 is eventually consistent: every lookup runs before "none"
        stubbed.ec2.add_response("describe_instances", reservations(), TOKEN_FILTER)
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    assert "no instance with client token tok-1" in raised.value.problems[-1].rule
    stubbed.assert_done()


def test_client_token_lookup_is_retried_with_backoff_until_it_answers(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    interrupt_run_instances(stubbed)
    stubbed.ec2.add_client_error(
        "describe_instances", "RequestLimitExceeded", "slow down", expected_params=TOKEN_FILTER
    )
    stubbed.ec2.add_client_error("describe_instances", "InternalError", "try again", expected_params=TOKEN_FILTER)
    stubbed.ec2.add_response("describe_instances", reservations(instance(state="pending")), TOKEN_FILTER)
    queue_terminate(stubbed)
    clock = FakeClock()
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(clock), progress=QUIET)
    assert raised.value.problems[-1].value == INSTANCE_ID and "terminated" in raised.value.problems[-1].rule
    assert clock.sleeps == [0.0, 2.0, 4.0]  # backoff between the lookups
    stubbed.assert_done()


def test_a_failed_client_token_lookup_says_could_not_check_and_what_to_run(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    interrupt_run_instances(stubbed)
    for _ in launch.CLIENT_TOKEN_BACKOFF_S:
        stubbed.ec2.add_client_error(
            "describe_instances", "RequestLimitExceeded", "slow down", expected_params=TOKEN_FILTER
        )
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=instant_pacing(), progress=QUIET)
    unknown = raised.value.problems[-1]
    assert "could not check" in unknown.rule and "no instance" not in unknown.rule
    assert "aws ec2 describe-instances --region us-east-1 --filters Name=client-token,Values=tok-1" in unknown.fix
    assert "aws ec2 terminate-instances --region us-east-1" in unknown.fix
    stubbed.assert_done()


def test_failed_cleanup_prints_the_command_that_stops_the_bill(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    queue_run_instances(stubbed)
    queue_running(stubbed, state="pending")
    stubbed.ec2.add_client_error("terminate_instances", "UnauthorizedOperation", "no")
    with pytest.raises(RuntimeProblem) as raised:
        execute_launch(plan, stubbed.clients, pacing=interrupting_pacing(), progress=QUIET)
    left = raised.value.problems[-1]
    assert "could NOT be terminated" in left.rule and "$21.50/h" in left.rule
    assert f"aws ec2 terminate-instances --region us-east-1 --instance-ids {INSTANCE_ID}" in left.fix


# ---------------------------------------------------------------- dry run


def test_dry_run_reports_allowed_and_denied(stubbed: StubbedAws) -> None:
    plan = planned(stubbed)
    dry = {**plan.params, "DryRun": True}
    stubbed.ec2.add_client_error(
        "run_instances", "DryRunOperation", "Request would have succeeded", expected_params=dry
    )
    stubbed.ec2.add_client_error(
        "run_instances", "UnauthorizedOperation", "You are not authorized", expected_params=dry
    )
    stubbed.ec2.add_client_error("run_instances", "InvalidSubnetID.NotFound", "no such subnet", expected_params=dry)

    allowed = check_permissions(plan, stubbed.clients)
    denied = check_permissions(plan, stubbed.clients)
    assert allowed.allowed and "iam:PassRole" in allowed.action
    assert not denied.allowed and "not authorized" in denied.detail
    with pytest.raises(UsageError):
        check_permissions(plan, stubbed.clients)
    stubbed.assert_done()


# ---------------------------------------------------------------- through the CLI: panels, exit codes, no traceback


@pytest.fixture
def cli_on_stubs(stubbed: StubbedAws, monkeypatch: pytest.MonkeyPatch) -> StubbedAws:
    monkeypatch.setattr(AwsClients, "for_region", classmethod(lambda cls, region, session=None: stubbed.clients))
    monkeypatch.setattr(deploy_cli, "PACING", instant_pacing())
    return stubbed


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["deploy", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def launch_args(*extra: str) -> list[str]:
    return ["launch", str(TRN1_CONFIG), "--region", REGION, "--name", "trn1", "--instance-profile", "p", *extra]


def test_cli_capacity_error_is_a_panel_not_a_traceback(cli_on_stubs: StubbedAws) -> None:
    queue_plan(cli_on_stubs, "trn1")
    cli_on_stubs.ec2.add_client_error("run_instances", "InsufficientInstanceCapacity", "no capacity")
    code, out = invoke(*launch_args("--yes"))
    assert code == 1 and "cannot continue" in out and "Capacity Block" in out and "Traceback" not in out


def test_cli_ctrl_c_terminates_and_exits_cleanly(cli_on_stubs: StubbedAws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy_cli, "PACING", interrupting_pacing())
    queue_plan(cli_on_stubs, "trn1")
    queue_run_instances(cli_on_stubs)
    queue_running(cli_on_stubs, state="pending")
    queue_terminate(cli_on_stubs)
    code, out = invoke(*launch_args("--yes"))
    assert code == 1 and "Ctrl-C" in out and "terminated because the launch did not finish" in out
    assert "Aborted" not in out and "Traceback" not in out
    cli_on_stubs.assert_done()


def test_cli_failed_bootstrap_prints_the_log_tail_and_terminates(cli_on_stubs: StubbedAws) -> None:
    queue_plan(cli_on_stubs, "trn1")
    queue_failed_bootstrap(cli_on_stubs)
    queue_terminate(cli_on_stubs)
    code, out = invoke(*launch_args("--yes"))
    assert code == 1 and LOG_LINE in out and "failed at step 'weights'" in out
    assert "terminated because the launch did not finish" in out and "Traceback" not in out
    cli_on_stubs.assert_done()


def test_cli_confirm_prompt_shows_the_capacity_block_price_not_on_demand(cli_on_stubs: StubbedAws) -> None:
    block = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "InstanceType": "trn1.32xlarge",
        "AvailabilityZone": "us-east-1d",
        "State": "active",
        "AvailableInstanceCount": 1,
        "ReservationType": "capacity-block",
        "EndDate": datetime(2099, 1, 1, 11, 30, tzinfo=timezone.utc),
    }
    queue_plan(cli_on_stubs, "trn1", reservation=block)
    result = CliRunner().invoke(
        main, ["deploy", *launch_args("--capacity-block-id", "cr-0123456789abcdef0")], input="n\n"
    )
    question = next(line for line in result.output.splitlines() if line.startswith("Launch "))
    assert "Capacity Block cr-0123456789abcdef0" in question and "upfront fee" in question
    assert "$21.50" not in result.output and "at most" not in result.output
    assert "nothing was created" in result.output
    cli_on_stubs.assert_done()


def test_cli_dry_run_denied_points_at_the_policy(cli_on_stubs: StubbedAws) -> None:
    queue_plan(cli_on_stubs, "trn1")
    cli_on_stubs.ec2.add_client_error("run_instances", "UnauthorizedOperation", "You are not authorized")
    code, out = invoke(*launch_args("--dry-run"))
    assert code == 1 and "deploy/iam/operator-policy.json" in out and "refused" in out


def test_cli_conflicting_flags_are_usage_errors(cli_on_stubs: StubbedAws) -> None:
    code, out = invoke(*launch_args("--capacity-block-id", "cr-1", "--capacity-reservation-id", "cr-2"))
    assert code == 2 and "not both" in out
    code, out = invoke("teardown", "x", "--all", "--region", REGION)
    assert code == 2


def test_cli_bad_region_is_refused_before_any_client_exists() -> None:
    code, out = invoke("list", "--region", "moon-base-1")
    assert code == 2 and "not an AWS region" in out
