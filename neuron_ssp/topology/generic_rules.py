"""Rules that hold on every backend: window k against positions, a shared vocabulary, the acceptor.

They need no hardware facts, so the torch reference backend checks them too.
"""

from __future__ import annotations

from neuron_ssp.config import Config, ModelConfig, greedy_acceptor_problem
from neuron_ssp.errors import Problem
from neuron_ssp.topology.models import ARCHITECTURES, Architecture
from neuron_ssp.topology.positions import draft_slots, slot_library, slot_rule, target_slots
from neuron_ssp.topology.report import ValidationReport


def check_window(config: Config, models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """k <= n_positions of every loaded model: each call may write k positions. (k >= 2 is enforced
    by the config schema; the schema checks the target's n_positions only when the config is built.)"""
    k = config.speculation.k
    for role, model in models.items():
        if k > model.n_positions:
            report.errors.append(
                Problem(
                    "speculation.k",
                    k,
                    f"exceeds {role}.n_positions ({model.n_positions})",
                    f"lower speculation.k or raise {role}.n_positions",
                )
            )


def check_positions(config: Config, models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """n_positions must hold every slot a generation writes (`neuron_ssp.topology.positions`): the KV cache is
    sized once, at compile time.

    Without `generation.max_prompt_tokens` a one-token prompt is assumed; the engine checks the real
    prompt at run time, by the same rule."""
    generation, engine, k = config.generation, config.speculation.engine, config.speculation.k
    prompt, new = generation.max_prompt_tokens or 1, generation.max_new_tokens
    library = slot_library(config)
    needs = {
        "target": target_slots(prompt, new, engine, k, library),
        "draft": draft_slots(prompt, new, engine, k, library),
    }
    prompt_text = (
        f"max_prompt_tokens ({prompt})"
        if generation.max_prompt_tokens
        else "a 1-token prompt (set generation.max_prompt_tokens for real prompts)"
    )
    for role, model in models.items():
        needed = needs[role]
        if model.n_positions < needed:
            report.errors.append(
                Problem(
                    f"{role}.n_positions",
                    model.n_positions,
                    f"must cover {prompt_text} and max_new_tokens ({new}): the {role} writes "
                    f"{slot_rule(engine, role, library)} = {needed} positions",
                    f"set {role}.n_positions to at least {needed}, or lower generation.max_new_tokens",
                )
            )


def check_acceptor(config: Config, report: ValidationReport) -> None:
    """An acceptor that cannot honour the sampling settings (greedy acceptance with a temperature)."""
    problem = greedy_acceptor_problem(config.speculation.acceptor, config.sampling.temperature)
    if problem is not None:
        report.errors.append(problem)


def check_vocabulary(
    architectures: dict[str, Architecture], draft: ModelConfig | None, report: ValidationReport
) -> None:
    """Draft and target must share a vocabulary: the target scores the draft's token ids."""
    if draft is None or "target" not in architectures or "draft" not in architectures:
        return
    target, drafted = architectures["target"], architectures["draft"]
    if target.vocab == drafted.vocab:
        return
    same_family = [a.name for a in ARCHITECTURES.values() if a.vocab == target.vocab and a.params < target.params]
    suggestion = f" (e.g. {', '.join(same_family)})" if same_family else ""
    report.errors.append(
        Problem(
            "draft.path",
            draft.path,
            f"the draft's vocabulary ({drafted.name}, {drafted.vocab} tokens) differs from the target's "
            f"({target.name}, {target.vocab} tokens), so its token ids mean other words",
            f"pick a draft with the target's tokenizer{suggestion}",
        )
    )
