"""Validation before any AWS call, ml.* types mapped to the catalog, IAM files, image and Dockerfile."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import deploy_fixtures
import pytest
import yaml
from click.testing import CliRunner
from sagemaker_fixtures import INF2_CONFIG, MODEL_S3, ROLE_ARN, ROOT, endpoint_plan

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.deploy.sagemaker import image
from neuron_ssp.deploy.sagemaker.autoscaling import Capacity, target_for
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.instances import catalog_instance, hosting_price
from neuron_ssp.deploy.sagemaker.plan import request_seconds
from neuron_ssp.deploy.sagemaker.queueing import SlotQueue, at_concurrency
from neuron_ssp.errors import UsageError

aws_sandbox = deploy_fixtures.aws_sandbox


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> SageMakerClients:
        raise AssertionError("validation must finish before any AWS client exists")

    monkeypatch.setattr(SageMakerClients, "for_region", refuse)


def create(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["deploy", "endpoint", "create", *args, "--yes"])
    return result.exit_code, result.output


def test_every_bad_flag_is_reported_at_once_before_any_aws_call(no_aws: None) -> None:
    code, out = create(
        str(INF2_CONFIG),
        "--region",
        "us-east-1",
        "--name",
        "bad_name!",
        "--model-s3",
        "s3://bucket/models",
        "--role-arn",
        "admin",
        "--instances",
        "5",
        "--min",
        "1",
        "--max",
        "3",
        "--image-uri",
        "docker.io/me/neuron-ssp:1",
    )
    assert code == 2, out
    for field in ("--name", "--model-s3", "--role-arn", "--instances", "--image-uri"):
        assert field in out
    assert "write s3://bucket/models/" in out and "within --min 1 and --max 3" in out


def test_missing_locations_say_how_to_get_them(no_aws: None) -> None:
    code, out = create(str(INF2_CONFIG), "--region", "us-east-1")
    assert code == 2 and "--model-s3" in out and "--role-arn" in out
    assert "deploy/iam/sagemaker-execution-role.json" in out


@pytest.mark.parametrize(
    "flag,words",
    [
        ("inf2.48xlarge", "start with 'ml.'"),
        ("ml.g5.12xlarge", "not a SageMaker-hosted Neuron instance type"),
        ("ml.inf2.8xlarge", "tp_degree"),  # 2 NeuronCores cannot hold tp 24: the topology rules say why
    ],
)
def test_instance_type_is_mapped_to_the_catalog_and_checked(no_aws: None, flag: str, words: str) -> None:
    code, out = create(
        str(INF2_CONFIG),
        "--region",
        "us-east-1",
        "--model-s3",
        MODEL_S3,
        "--role-arn",
        ROLE_ARN,
        "--instance-type",
        flag,
    )
    assert code == 2, out
    assert words in out


def test_ml_types_map_to_catalog_entries_with_sagemaker_prices() -> None:
    assert catalog_instance("ml.inf2.48xlarge").name == "inf2.48xlarge"
    assert catalog_instance("ml.trn1.32xlarge").neuron_cores == 32
    price = hosting_price("ml.trn1.32xlarge")
    assert price.usd_per_hour == 24.73 and "2026-09-27" in price.source
    assert hosting_price("ml.trn1n.32xlarge").usd_per_hour is None  # no price recorded: said so, not guessed
    assert catalog_instance("ml.trn2.48xlarge").generation == "trn2"  # NxDI and vllm-neuron: the topology rules
    with pytest.raises(UsageError):
        catalog_instance("ml.g5.12xlarge")


def test_torch_config_is_refused(no_aws: None) -> None:
    code, out = create(
        str(ROOT / "configs" / "default.yaml"), "--region", "us-east-1", "--model-s3", MODEL_S3, "--role-arn", ROLE_ARN
    )
    assert code == 2 and "platform.backend" in out and "Neuron configs only" in out


def test_s3_artifacts_are_refused_under_network_isolation(tmp_path: Path, no_aws: None) -> None:
    data = yaml.safe_load(INF2_CONFIG.read_text())
    data["neuron"]["compiled_dir"] = "s3://my-artifacts/compiled"
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = create(str(path), "--region", "us-east-1", "--model-s3", MODEL_S3, "--role-arn", ROLE_ARN)
    assert code == 2 and "neuron.compiled_dir" in out and "cannot reach S3" in out
    plan = endpoint_plan(path, network_isolation=False)
    served = json.loads(plan.model_request["PrimaryContainer"]["Environment"]["NEURON_SSP_CONFIG"])
    assert served["neuron"]["compiled_dir"] == "s3://my-artifacts/compiled"


def test_concurrency_target_is_explained_from_batch_one() -> None:
    value, why = target_for("concurrency", None, None)
    assert value == 1.0 and "batch 1" in why and "~50% busy" in why
    value, why = target_for("concurrency", 3.0, None)
    assert "~75% busy" in why


def test_slot_queue_matches_the_closed_forms_by_hand() -> None:
    """M/M/1: L = ρ/(1-ρ), wait ρ/(1-ρ) generations. M/M/4 at ρ = 0.5 (load 2): Erlang C = (4/3) / (19/3 + 4/3)
    = 4/23, so L = 2 + 4/23 and the mean wait is (4/23) / (4 × 0.5) = 2/23 of a generation."""
    for rho in (0.2, 0.5, 0.75):
        one = SlotQueue(1, rho)
        assert one.wait_probability == pytest.approx(rho) and one.in_system == pytest.approx(rho / (1 - rho))
        assert one.wait_in_generations == pytest.approx(rho / (1 - rho))
    four = SlotQueue(4, 0.5)
    assert four.wait_probability == pytest.approx(4 / 23)
    assert four.in_system == pytest.approx(2 + 4 / 23) and four.wait_in_generations == pytest.approx(2 / 23)
    assert at_concurrency(4, SlotQueue(4, 0.3).in_system).utilisation == pytest.approx(0.3)
    assert SlotQueue(64, 0.9).wait_probability < 1  # Erlang B's recursion: no factorial overflows


def test_concurrency_target_comes_from_the_batch_capacity() -> None:
    """Four requests at once: ~2.2 in the system keeps the slots half busy (the batch-1 rule's utilisation), and a
    request waits ~0.09 of a generation instead of one."""
    value, why = target_for("concurrency", None, None, Capacity(4, "target.batch_size 4"))
    assert value == 2.2 and "runs 4 at once (target.batch_size 4)" in why and "M/M/4" in why
    assert "~50% busy" in why and "~0.09 generation(s)" in why
    value, why = target_for("concurrency", 3.0, None, Capacity(4, "target.batch_size 4"))
    assert value == 3.0 and "~62% busy" in why and "~0.21 generation(s)" in why  # 2.48 + 0.51 queued


def test_invocations_target_at_a_batch_says_what_it_assumes() -> None:
    value, why = target_for("invocations", None, 10.0, Capacity(4, "target.batch_size 4"))
    assert value == 12.0  # 4 slots x 60 / 10 s a minute at full load, half of it
    assert "~10.0 s per request" in why and "no speedup from speculation counted" in why
    assert "scaled to batch 4 by the bytes a call reads" in why and "an assumption" in why and "--target-value" in why
    assert "published ms/token at batch 1" in target_for("invocations", None, 10.0)[1]


def test_request_seconds_come_from_the_batch_projection() -> None:
    """Batch 1: the published plain-decoding ms/token x max_new_tokens (Llama-2-70B on trn1: 20.6 ms x 512). Batch 4:
    plan --engine's projected call at batch 4 (topology/batch_projection.py), the same figure the plan prints."""
    from neuron_ssp.topology import plan_deployment
    from neuron_ssp.topology.batch_projection import plan_batch_projection

    trn1 = load_config(ROOT / "configs" / "llama2-70b-7b-trn1-bf16.yaml")
    assert request_seconds(trn1, 1) == pytest.approx(20.6 * 512 / 1000)
    batched = load_config(ROOT / "configs" / "llama3-70b-8b-trn1-x4-bf16.yaml")
    call_ms = plan_batch_projection(batched, plan_deployment(batched), "native", 0.8, [4]).rows[0].target_call_ms
    assert request_seconds(batched, 4) == pytest.approx(call_ms * 512 / 1000)
    assert request_seconds(batched, 4) > request_seconds(batched, 1) == pytest.approx(21.4 * 512 / 1000)
    assert request_seconds(load_config(ROOT / "configs" / "llama3-70b-8b-inf2-bf16.yaml"), 1) is None  # unpublished


def test_a_batch_four_config_scales_from_four_requests_at_once(no_aws: None) -> None:
    """The shipped x4 config end to end (dry run): 4 at once, concurrency 2.2, invocations from the batch-4 time."""
    x4 = str(ROOT / "configs" / "llama3-70b-8b-trn1-x4-bf16.yaml")
    common = (x4, "--model-s3", MODEL_S3, "--role-arn", ROLE_ARN, "--min", "1", "--max", "2", "--dry-run")
    code, out = create(*common)
    assert code == 0, out
    assert "4 per instance (serve.max_batch 4 within target.batch_size 4" in out
    assert '"TargetValue": 2.2' in out and '"neuron-ssp:serving-batch"' in out
    code, out = create(*common, "--scaling-metric", "invocations")
    assert code == 0, out
    seconds = request_seconds(load_config(x4), 4)
    assert f'"TargetValue": {round(0.5 * 4 * 60 / seconds, 1)}' in out and f"~{seconds:.1f} s per request" in out


def test_a_concurrency_target_the_container_cannot_hold_is_refused(no_aws: None) -> None:
    """Past serving batch + serve.max_queue requests the container answers 503: its concurrency never reaches 30."""
    code, out = create(
        str(INF2_CONFIG),
        "--model-s3",
        MODEL_S3,
        "--role-arn",
        ROLE_ARN,
        "--min",
        "1",
        "--max",
        "2",
        "--target-value",
        "30",
        "--dry-run",
    )
    assert code == 2 and "--target-value" in out and "at most 17 requests" in out, out
    code, out = create(
        str(INF2_CONFIG),
        "--model-s3",
        MODEL_S3,
        "--role-arn",
        ROLE_ARN,
        "--min",
        "1",
        "--max",
        "2",
        "--target-value",
        "3",
        "--dry-run",
    )
    assert code == 0, out


def test_invocations_target_needs_a_latency_or_a_value() -> None:
    with pytest.raises(ValueError):
        target_for("invocations", None, None)
    assert target_for("invocations", 12.0, None)[0] == 12.0


def test_image_build_prints_the_command_without_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(image, "docker_available", lambda: False)
    result = CliRunner().invoke(main, ["deploy", "image", "build", "--tag", "0.1.0"])
    assert result.exit_code == 0, result.output
    assert "docker build -f deploy/sagemaker/Dockerfile -t neuron-ssp:0.1.0 ." in result.output


def test_image_build_runs_docker_and_reports_its_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    calls: list[list[str]] = []
    monkeypatch.setattr(image, "docker_available", lambda: True)
    monkeypatch.setattr(image, "_subprocess_runner", lambda argv, stdin: calls.append(argv) or 1)
    result = CliRunner().invoke(main, ["deploy", "image", "build", "--tag", "t"])
    assert result.exit_code == 1 and "exited with code 1" in result.output
    assert calls == [["docker", "build", "-f", "deploy/sagemaker/Dockerfile", "-t", "neuron-ssp:t", "."]]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / "deploy" / "sagemaker" / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_image_runs_the_tested_entrypoint_on_a_dlc_of_the_last_sdk_with_transformers_neuronx() -> None:
    """Read as docker would: the ENTRYPOINT is the `serve` script the next test runs, copied and made
    executable; the base is a Neuron DLC, pinned by tag, of a Neuron SDK no newer than the DLAMI pin's
    (transformers-neuronx left both with SDK 2.26)."""
    from neuron_ssp.deploy.ami import PINNED

    steps = dockerfile_instructions()
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    (base,) = [a for op, a in steps if op == "FROM"]
    image = base.replace("${BASE_IMAGE}", args["BASE_IMAGE"])
    registry, tag = image.rsplit(":", 1)
    assert registry == "public.ecr.aws/neuron/pytorch-inference-neuronx" and tag != "latest"
    sdk = re.search(r"-sdk(\d+)\.(\d+)", tag)
    assert sdk is not None and tuple(map(int, sdk.groups())) <= tuple(map(int, PINNED.sdk.split(".")))
    copied = {a.split()[-1]: a.split()[:-1] for op, a in steps if op == "COPY"}
    (entrypoint,) = json.loads(next(a for op, a in steps if op == "ENTRYPOINT"))
    assert copied[entrypoint] == ["deploy/sagemaker/serve"] and (ROOT / "deploy/sagemaker/serve").is_file()
    assert any(op == "RUN" and "chmod" in a and "755" in a and entrypoint in a for op, a in steps)
    # the build fails unless the DLC's library (transformers-neuronx by default) and our package import together
    assert args["LIBRARY_MODULE"] == "transformers_neuronx"
    assert any(op == "RUN" and "import ${LIBRARY_MODULE}, neuron_ssp" in a for op, a in steps)


def test_container_config_round_trips_through_the_loader(tmp_path: Path) -> None:
    """What the entrypoint writes (JSON) loads as a config with the mounted paths."""
    plan = endpoint_plan(INF2_CONFIG)
    path = tmp_path / "served.yaml"
    path.write_text(plan.model_request["PrimaryContainer"]["Environment"]["NEURON_SSP_CONFIG"])
    served = load_config(path)
    assert served.target.path == "/opt/ml/model/Llama-2-70b-hf" and served.speculation.k == 5
    assert served.platform.instance_type == "inf2.48xlarge" and served.neuron.compiled_dir == "/opt/ml/model/compiled"


def test_entrypoint_drops_sagemakers_serve_argument_and_writes_the_config(tmp_path: Path) -> None:
    import os
    import subprocess

    fake = tmp_path / "bin" / "neuron-ssp"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "ARGS $*"\ncat "$4"\n')
    fake.chmod(0o755)
    config = '{"name":"x","speculation":{"k":5}}'
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "NEURON_SSP_CONFIG": config}
    out = subprocess.run(
        ["sh", str(ROOT / "deploy" / "sagemaker" / "serve"), "serve"],
        env=env,
        text=True,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    assert "ARGS serve --sagemaker --config /tmp/neuron-ssp-config.yaml\n" in out and config in out


def test_build_context_sends_only_what_the_dockerfile_copies() -> None:
    ignore = (ROOT / "deploy" / "sagemaker" / "Dockerfile.dockerignore").read_text().split()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    copied = {p for op, a in dockerfile_instructions() if op == "COPY" for p in a.split()[:-1]}
    assert "*" in ignore and copied == kept


def test_lmis_s3_neff_cache_is_refused_under_network_isolation(tmp_path: Path, no_aws: None) -> None:
    data = yaml.safe_load(INF2_CONFIG.read_text())
    data["neuron"]["compile_cache_url"] = "s3://my-artifacts/neff"
    path = tmp_path / "lmi-s3.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = create(
        str(path), "--region", "us-east-1", "--engine", "lmi", "--model-s3", MODEL_S3, "--role-arn", ROLE_ARN
    )
    assert code == 2 and "neuron.compile_cache_url" in out and "cannot reach S3" in out
    plan = endpoint_plan(path, engine="lmi", network_isolation=False)
    assert (
        plan.model_request["PrimaryContainer"]["Environment"]["OPTION_COMPILED_GRAPH_PATH"] == "s3://my-artifacts/neff"
    )
