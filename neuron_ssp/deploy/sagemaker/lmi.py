"""DJL LMI (transformers-neuronx) options derived from a validated config, or why LMI cannot run it.

Option names and meanings are djl-serving's own, read at the parent of commit 1132e3ab (PR #2939,
which removed Neuron support): `engines/python/setup/djl_python/properties_manager/tnx_properties.py`
and `serving/docs/lmi/user_guides/tnx_user_guide.md`. There `speculative_length` is passed unchanged
to transformers-neuronx `enable_speculative_decoder(k)` and to `speculative_forward(speculation_length=)`,
and the draft proposes `speculative_length - 1` tokens: it is our window k (the user guide's "number
of tokens the draft generates" is off by one). LMI accepts with `LMIGreedyTokenAcceptor` (the target's
argmax), speculates only in its naive rolling-batch scheduler (no continuous batching) at batch 1,
and reports no acceptance metrics per request.

Batch (read at afece25d; the same lines in the 0.30.0-dlc branch the image was built from): with a draft model
`NeuronRollingBatch` always takes `NaiveRollingBatchNeuronGenerator` (rolling_batch/neuron_rolling_batch.py:44),
whose speculative step sends the first running request's cache position for the whole batch ("Workaround until
continuous batching and batch size > 1 is supported", transformers_neuronx_scheduler/optimum_neuron_scheduler.py:531;
"TODO ... once batch > 1 is supported", :596); its continuous-batching scheduler raises "Continuous batching does
not support speculative decoding" (:372, :378). Rolling batch compiles the models at max_rolling_batch_size
(transformers_neuronx.py:180), and batch_size > 1 is refused together with rolling batch
(tnx_properties.py:222) while without rolling batch `model.generate` runs with no draft (transformers_neuronx.py:473).
So a draft model means one request at a time: max_rolling_batch_size 1, whatever batch the config asks for.
(djl-serving 0.31.0 added rolling_batch=vllm with a draft, vLLM's Neuron speculation (commit b3ee5558), which
is not what LMI 0.30.0 runs or what is rendered here.)

`compiled_graph_path` / `draft_model_compiled_path` (tnx_properties.py `compiled_path_validator`,
lines 227-239 at afece25d) take an `s3://bucket/key` NEFF cache (set as NEURON_COMPILE_CACHE_URL) or an
existing directory, which `neuron_utils/model_loader.py` (lines 392-397) hands to `model.load(dir)`: a
transformers-neuronx `save()` layout. A compile cache is not that, so only an S3 cache is passed on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from neuron_ssp.config import Config
from neuron_ssp.deploy.sagemaker.container import MODEL_MOUNT, mounted
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.serve.capacity import serving_batch

# The last LMI releases with transformers-neuronx: 0.30.0 (SDK 2.20.1) in LMI's README at that parent
# commit; 0.29.0 (SDK 2.19.1) in the SageMaker SDK's image config.
LMI_IMAGE_TAG = "djl-inference:0.30.0-neuronx-sdk2.20.1"
# The regions and registry accounts of the djl-inference neuronx images, as aws/sagemaker-python-sdk lists
# them (src/sagemaker/image_uri_config/djl-neuronx.json at 00b19e73, the same for every 0.2x release).
LMI_REGISTRIES = {
    **dict.fromkeys(
        (
            "ap-northeast-1",
            "ap-south-1",
            "ap-southeast-1",
            "ap-southeast-2",
            "eu-central-1",
            "eu-west-1",
            "eu-west-3",
            "sa-east-1",
            "us-east-1",
            "us-east-2",
            "us-west-2",
        ),
        "763104351884",
    ),
    "ca-west-1": "204538143572",
}
LMI_ENTRYPOINT = "djl_python.transformers_neuronx"
_LMI_S3_CACHE = re.compile(r"^s3://[^/]+/.+")  # djl-serving's own test for an S3 compiled_graph_path
LMI_BATCH_REASON = "LMI speculates one request at a time (option.max_rolling_batch_size 1)"
LMI_BATCH_RULE = (
    "LMI 0.30.0 speculates in its naive rolling batch at batch 1: with a draft model its speculative step uses "
    "the first request's cache position for the whole batch and its continuous batching refuses speculation, "
    "so option.max_rolling_batch_size stays 1 and the models are compiled for batch 1"
)
LMI_LIMITS = (
    "greedy acceptance only (LMIGreedyTokenAcceptor: the target's argmax; no sampling with speculation)",
    "no continuous batching with speculation (naive rolling batch, batch size 1: one request at a time)",
    "no per-request acceptance metrics (neuron-ssp's engine returns a `speculative` field)",
)


@dataclass(frozen=True)
class LmiOptions:
    """`option.*` keys (without the prefix) in the order they are rendered, plus what this config should know
    (LMI_LIMITS hold for every config and are not repeated here)."""

    options: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def serving_properties(self, comment: str = "") -> str:
        lines = [f"# {line}" for line in comment.splitlines()] + ["engine=Python"]
        lines += [f"option.{key}={value}" for key, value in self.options.items()]
        return "\n".join(lines) + "\n"

    def environment(self) -> dict[str, str]:
        """option.<key> -> OPTION_<KEY> (LMI's configurations.md rule for environment variables)."""
        return {f"OPTION_{key.upper()}": value for key, value in self.options.items()}


def lmi_image(region: str) -> str:
    """LMI's neuronx image in `region`; UsageError naming --image-uri where none is listed."""
    account = LMI_REGISTRIES.get(region)
    if account is None:
        raise UsageError(
            Problem(
                "--image-uri",
                None,
                f"no LMI neuronx image is listed for {region} (listed: {', '.join(sorted(LMI_REGISTRIES))})",
                f"pass --image-uri with the {LMI_IMAGE_TAG} image you can pull in {region}, or use a listed region",
            )
        )
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{LMI_IMAGE_TAG}"


def lmi_refusals(config: Config) -> list[Problem]:
    """Every reason LMI cannot express this config (all at once)."""
    spec, problems = config.speculation, []
    if spec.drafter != "model" or config.draft is None:
        problems.append(
            Problem(
                "speculation.drafter",
                spec.drafter,
                "LMI speculates only with a draft model (option.speculative_draft_model); it has no prompt-lookup "
                "or suffix drafter",
                "use --engine neuron-ssp, or set speculation.drafter: model with a draft: section",
            )
        )
    greedy_equivalent = spec.acceptor == "greedy" or (
        spec.acceptor == "probabilistic" and config.sampling.temperature == 0
    )
    if not greedy_equivalent:
        problems.append(
            Problem(
                "speculation.acceptor",
                f"{spec.acceptor} (temperature {config.sampling.temperature:g})",
                "LMI accepts greedily (the target's argmax) only; this acceptor samples",
                "use --engine neuron-ssp for lossless sampling, or set speculation.acceptor: greedy "
                "(or sampling.temperature: 0)",
            )
        )
    if spec.policy != "fixed":
        problems.append(
            Problem(
                "speculation.policy",
                spec.policy,
                "LMI drafts a fixed speculative_length every step",
                "use --engine neuron-ssp, or set speculation.policy: fixed",
            )
        )
    if config.draft is not None and config.draft.dtype != config.target.dtype:
        problems.append(
            Problem(
                "draft.dtype",
                config.draft.dtype,
                f"LMI loads the draft with the target's dtype ({config.target.dtype})",
                f"set draft.dtype: {config.target.dtype}, or use --engine neuron-ssp",
            )
        )
    cache = config.neuron.compile_cache_url
    if cache and not _LMI_S3_CACHE.match(cache):
        problems.append(
            Problem(
                "neuron.compile_cache_url",
                cache,
                "LMI reads compiled_graph_path as an s3://bucket/prefix NEFF cache, or as a directory it passes to "
                "transformers-neuronx model.load() (a save() layout, which a compile cache is not)",
                "point it to s3://bucket/prefix (the container then needs --no-network-isolation), or leave it "
                "out and LMI compiles at startup",
            )
        )
    return problems


def lmi_options(config: Config, model_root: str = MODEL_MOUNT) -> LmiOptions:
    """The options for LMI's transformers-neuronx engine, or UsageError with every refusal."""
    problems = lmi_refusals(config)
    if problems:
        raise UsageError(problems)
    assert config.draft is not None  # lmi_refusals requires a draft model
    target, draft = config.target, config.draft
    options = {
        "entryPoint": LMI_ENTRYPOINT,
        "model_id": mounted(target.path, model_root),
        "tensor_parallel_degree": str(target.tp_degree),
        "n_positions": str(target.n_positions),
        "dtype": target.dtype,
        "rolling_batch": "auto",
        "max_rolling_batch_size": "1",
        "speculative_draft_model": mounted(draft.path, model_root),
        "speculative_length": str(config.speculation.k),
        "draft_model_tp_size": str(draft.tp_degree),
        "model_loading_timeout": "3600",
    }
    notes = lmi_batch_notes(config)
    cache = config.neuron.compile_cache_url
    if cache:
        # an S3 NEFF cache (lmi_refusals refused anything else): LMI sets NEURON_COMPILE_CACHE_URL to it.
        options["compiled_graph_path"] = cache
        options["draft_model_compiled_path"] = cache
    if config.neuron.compiled_dir:
        notes.append(
            f"neuron.compiled_dir ({config.neuron.compiled_dir}) holds neuron-ssp artifacts, which LMI "
            "cannot load; set neuron.compile_cache_url to a NEFF cache to skip LMI's compile"
        )
    if config.generation.max_new_tokens:
        notes.append(
            f"generation.max_new_tokens ({config.generation.max_new_tokens}) is a request parameter "
            "in LMI: send it as parameters.max_new_tokens"
        )
    return LmiOptions(options, notes)


def lmi_batch_notes(config: Config) -> list[str]:
    """Each batch the config asks for that LMI will not run: the target's and draft's compiled batch, and a
    serve.max_batch the config sets (its default is neuron-ssp's server's, not a request of the user's)."""
    asked = [
        (f"{role}.batch_size", model.batch_size)
        for role, model in (("target", config.target), ("draft", config.draft))
        if model is not None and model.batch_size > 1
    ]
    if "max_batch" in config.serve.model_fields_set and config.serve.max_batch > 1:
        asked.append(("serve.max_batch", config.serve.max_batch))
    rows = serving_batch(config)
    fix = (
        f"use --engine neuron-ssp, which serves {rows} requests at once with this config, or accept one at a "
        "time with LMI (max_rolling_batch_size=1 is rendered either way)"
        if rows > 1
        else "to batch, compile the target for a batch (target.batch_size) and use --engine neuron-ssp; as it is, "
        "this config serves one request at a time with either engine"
    )
    return [str(Problem(field, value, LMI_BATCH_RULE, fix)) for field, value in asked]
