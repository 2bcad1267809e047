"""Rules of the `neuron.nxdi` settings: NeuronConfig arguments that NxD Inference checks only when it builds the
model, or not at all, on a machine billed by the hour.

Buckets (models/config.py:192-201 and model_wrapper.py:903 at 4bcdc54b): NxDI asserts the largest context bucket
<= max_context_length and the largest decoding bucket <= max_length (= seq_len = n_positions); a prompt or a
cache longer than the largest bucket is refused at run time. So each list must end exactly at the length the
model is compiled for, for every model it is passed to (draft and target alike, as NxDI's demo copies them).
"""

from __future__ import annotations

from neuron_ssp.config import Config, ModelConfig, NxdiSettings
from neuron_ssp.errors import Problem
from neuron_ssp.topology.nxdi_graphs import max_context_length, nxdi_context_buckets, nxdi_token_buckets
from neuron_ssp.topology.report import ValidationReport

FIELD = "neuron.nxdi"
KERNELS = ("qkv_kernel_enabled", "attn_kernel_enabled", "mlp_kernel_enabled")
SHORT_BUCKET = 1024


def check_nxdi_settings(config: Config, models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """A neuron.nxdi section under another library, and buckets that do not end where the models do."""
    settings = config.neuron.nxdi
    if config.neuron.library != "nxdi":
        if settings != NxdiSettings():
            report.errors.append(
                Problem(
                    FIELD,
                    settings.model_dump(exclude_defaults=True),
                    f"these are NxD Inference NeuronConfig arguments; {config.neuron.library} would ignore them",
                    "remove the neuron.nxdi section, or set neuron.library: nxdi",
                )
            )
        return
    if config.platform.backend != "neuron":
        return  # the torch backend runs the same config without compiling anything
    lengths = {
        "context_encoding_buckets": (
            {role: max_context_length(config, model) for role, model in models.items()},
            "the longest prompt it is compiled for (max_context_length: "
            "generation.max_prompt_tokens, at most its n_positions)",
        ),
        "token_generation_buckets": (
            {role: model.n_positions for role, model in models.items()},
            "its n_positions (NxDI's max_length)",
        ),
    }
    _check_kernel_buckets(config, models, report)
    for name, (needed, what) in lengths.items():
        buckets = getattr(settings, name)
        wrong = {role: length for role, length in needed.items() if buckets and buckets[-1] != length}
        if wrong:
            said = ", ".join(f"{role} {length}" for role, length in wrong.items())
            report.errors.append(
                Problem(
                    f"{FIELD}.{name}",
                    buckets,
                    f"the largest bucket must be each model's {what}: {said}. NxDI refuses a larger one when it "
                    "builds the model (models/config.py:192-201) and any longer input at run time "
                    "(model_wrapper.py:903)",
                    _fix(name, buckets, set(wrong.values())),
                )
            )


def _check_kernel_buckets(config: Config, models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """AWS's trn2 Llama-3.3-70B tutorial (trn2-llama3.3-70b-tutorial.rst:338-344): "Using kernels with bucket
    length of 1024 or less may lead to Numerical Error in inference"."""
    settings = config.neuron.nxdi
    kernels = [name for name in KERNELS if getattr(settings, name)]
    short = sorted(
        {
            b
            for model in models.values()
            for b in (*nxdi_context_buckets(config, model), *nxdi_token_buckets(config, model))
            if b <= SHORT_BUCKET
        }
    )
    if kernels and short:
        report.warnings.append(
            Problem(
                f"{FIELD}.{kernels[0]}",
                True,
                f"{', '.join(kernels)} with buckets of {SHORT_BUCKET} or less ({', '.join(map(str, short))}): AWS's "
                "trn2 Llama-3.3-70B tutorial warns that its kernels may then fail with 'Numerical Error' at run time",
                f"list buckets above {SHORT_BUCKET} in {FIELD}.context_encoding_buckets and token_generation_buckets "
                "(the tutorial starts at 2048), or turn the kernels off",
            )
        )


def _fix(name: str, buckets: list[int], lengths: set[int]) -> str:
    if len(lengths) > 1:
        return (
            f"give draft and target the same n_positions (and so the same longest prompt), then end {name} "
            f"with it, or leave {name} out for the default"
        )
    (length,) = lengths
    kept = [b for b in buckets if b < length] + [length]
    return f"set {FIELD}.{name}: {kept}, or leave it out for the default"
