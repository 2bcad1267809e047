"""One table of NxD Inference releases per instance family (topology/nxdi_releases.py): the install advice,
doctor, validate, deploy's DLAMI and DLC pins and docs/neuron.md all read it. Pure logic: runs in every venv."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from neuron_ssp.backends.nxdi import api
from neuron_ssp.backends.nxdi.env import LAST_TRN1_INF2_SDK, sdk_of
from neuron_ssp.deploy import ami
from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.topology.catalog import INSTANCES
from neuron_ssp.topology.nxdi_releases import NXDI_BY_FAMILY, install_advice, release_for

DOCS = Path(__file__).parents[1] / "docs" / "neuron.md"
TABLE_HEADER = "| instance family | Neuron SDK | neuronx-distributed-inference |"


def docs_table() -> dict[str, list[str]]:
    """docs/neuron.md's release table: family -> its other cells, backticks dropped."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADER))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_docs_table_is_the_codes_table() -> None:
    expected = {
        family: [r.sdk, r.nxdi, r.nxd, r.torch_neuronx, r.neuronx_cc, r.venv, r.dlc]
        for family, r in NXDI_BY_FAMILY.items()
    }
    assert docs_table() == expected


def test_every_instance_family_has_a_release_and_trn1_inf2_stay_on_sdk_2_28() -> None:
    assert {i.generation for i in INSTANCES.values()} == set(NXDI_BY_FAMILY)
    assert release_for("trn1") == release_for("inf2") and release_for("trn1").sdk == LAST_TRN1_INF2_SDK == "2.28"
    for release in NXDI_BY_FAMILY.values():  # the pinned version belongs to the SDK it is listed under
        assert sdk_of(release.nxdi) == release.sdk


def test_install_advice_pins_the_release_of_the_instance_family() -> None:
    """'<0.11' installs 0.10, whose models run on Trn2 only (NxDI release notes, 2.29.0): each family gets its pin."""
    trn1 = install_advice("trn1")
    assert "neuronx-distributed-inference==0.8.16251 neuronx-distributed==0.17.26814" in trn1
    assert "Neuron SDK 2.28" in trn1 and "0.10" not in trn1
    trn2 = install_advice("trn2")
    assert "neuronx-distributed-inference==0.10.18399" in trn2 and "Neuron SDK 2.31" in trn2
    assert install_advice() == f"{trn1.replace('on trn1,', 'on trn1/inf2,')}; {trn2}"


def test_the_install_messages_name_each_familys_pin_not_a_range() -> None:
    """Before: "pip install 'neuronx-distributed-inference<0.11'" and "on trn2 the newest" DLAMI (2.32 has none)."""
    for text in (api.INSTALL, problem_fix()):
        assert "<0.11" not in text and "newest" not in text
        assert "==0.8.16251" in text and "==0.10.18399" in text


def test_a_problem_on_a_known_family_names_only_its_pin() -> None:
    fix = problem_fix(family="inf2")
    assert "==0.8.16251" in fix and "0.10.18399" not in fix


def problem_fix(**fields: str) -> str:
    """The fix of the RuntimeProblem raised when NeuronConfig does not take an argument we pass."""
    config = SimpleNamespace(NeuronConfig=lambda **kwargs: SimpleNamespace(tp_degree=2))
    nxdi = api.NxdiApi("0.10.18399", config, SimpleNamespace(), SimpleNamespace(), **fields)
    with pytest.raises(RuntimeProblem) as error:
        nxdi.neuron_config({"tp_degree": 1})
    return error.value.problems[0].fix


@pytest.mark.parametrize("family", sorted(NXDI_BY_FAMILY))
def test_deploy_boots_the_tables_dlami_venv_and_dlc(family: str) -> None:
    pin, release = ami.pin_for("nxdi", family), release_for(family)
    assert (pin.sdk, pin.venv, pin.dlc, pin.support) == (release.sdk, release.venv, release.dlc, release.support)


def test_the_validate_warning_on_trn1_names_the_pin() -> None:
    from topology_cases import merged, neuron_pair

    from neuron_ssp.config import config_from_dict
    from neuron_ssp.topology import validate_config

    report = validate_config(config_from_dict(merged(neuron_pair(), neuron={"library": "nxdi"})))
    (warning,) = [w for w in report.warnings if w.field == "neuron.library"]
    assert re.search(r"neuronx-distributed-inference==0\.8\.16251", warning.fix)


def test_doctor_names_the_release_this_instance_needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An NxDI of another SDK than the instance family's (0.10 on a trn1) is named, with that family's install."""
    from click.testing import CliRunner

    from neuron_ssp.backends.nxdi.env import NxdiInstall
    from neuron_ssp.cli import main

    monkeypatch.setattr("neuron_ssp.backends.nxdi.env.probe_nxdi", lambda: NxdiInstall("0.10.18399", "2.31", []))
    args = ["doctor", "--instance", "trn1.32xlarge", "--configs", str(tmp_path)]
    report = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["nxdi"]
    assert (report["family"], report["release_needed"], report["release_fits"]) == ("trn1", "0.8.16251", False)
    assert report["release_advice"] == install_advice("trn1")
    text = " ".join(CliRunner().invoke(main, args, env={"COLUMNS": "100"}).output.split())
    assert "this trn1 instance needs NxD Inference 0.8.16251: on trn1, Neuron SDK 2.28" in text
