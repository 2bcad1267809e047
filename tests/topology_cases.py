"""Config builders shared by the topology tests: a known-good Neuron pair and deep-merged variants."""

from __future__ import annotations

import copy
from typing import Any

from neuron_ssp.config import config_from_dict
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import validate_config

LLAMA2_70B = "/opt/models/Llama-2-70b-hf"
LLAMA2_7B = "/opt/models/Llama-2-7b-hf"
LLAMA3_70B = "/opt/models/Meta-Llama-3-70B-Instruct"
LLAMA3_8B = "/opt/models/Meta-Llama-3-8B-Instruct"


def neuron_pair(
    instance: str = "trn1.32xlarge", dtype: str = "bf16", tp: int = 32, target: str = LLAMA2_70B, draft: str = LLAMA2_7B
) -> dict[str, Any]:
    """Target + draft in one process on the same cores, as transformers-neuronx needs."""
    model = {"dtype": dtype, "tp_degree": tp, "n_positions": 2048, "batch_size": 1}
    return {
        "name": "case",
        "platform": {"backend": "neuron", "instance_type": instance},
        "target": {"path": target, **model},
        "draft": {"path": draft, **model},
        "speculation": {"k": 5, "drafter": "model"},
        "generation": {"max_new_tokens": 256, "max_prompt_tokens": 1024},
    }


def merged(base: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    """`base` with each section's keys overridden (a None value removes the key)."""
    data = copy.deepcopy(base)
    for section, values in sections.items():
        target = data.setdefault(section, {})
        for key, value in values.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return data


def problems(data: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of a config dict: schema problems first, else the topology report."""
    try:
        config = config_from_dict(data)
    except UsageError as exc:
        return exc.problems, []
    report = validate_config(config)
    return report.errors, report.warnings
