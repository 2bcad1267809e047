"""The user's path on Neuron: config -> load_pipeline -> text, through the stand-in transformers_neuronx."""

from __future__ import annotations

from types import ModuleType

import pytest
from neuron_support import neuron_config, with_eos, with_tokenizer

from neuron_ssp.pipeline.load import load_pipeline

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, tiny_model_dirs


@pytest.mark.parametrize("engine", ["native", "library"])
def test_neuron_config_generates_text_equal_to_plain_greedy(
    neuronx: ModuleType, tiny_model_dirs, tmp_path, engine: str
) -> None:
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = neuron_config(
        target, tiny_model_dirs["draft"], speculation={"engine": engine}, generation={"chat_template": False}
    )
    pipeline = load_pipeline(config)
    prompt = "w5 w9 w11 w5 w9 w40 w41"
    ssp = pipeline.speculative(prompt)
    assert ssp.tokens == pipeline.plain(prompt).tokens
    assert ssp.text and ssp.result.stats.target_calls > 0
    assert type(pipeline.target).__name__ == "NeuronBackend"


def test_one_compiled_target_serves_every_k_with_output_equal_to_plain_greedy(
    neuronx: ModuleType, tiny_model_dirs, tmp_path
) -> None:
    from neuron_ssp.engines.native import plain_generate
    from neuron_ssp.tools.per_k import compiled_target_groups

    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = neuron_config(
        target,
        tiny_model_dirs["draft"],
        neuron={"compiled_dir": str(tmp_path / "compiled")},
        generation={"chat_template": False},
    )
    ks = list(range(2, 9))
    (group,) = compiled_target_groups(config, ks)  # compiles once, loads once
    loads = [m for m, c, _ in neuronx.RUNTIME.events if c == "from_pretrained"]
    assert loads.count(target.name) == 2  # the compile and the one load, not one per k
    ids = group.pipeline.encode("w5 w9 w11 w5 w9 w40 w41")
    plain = plain_generate(group.pipeline.target, ids, 20, config.sampling).tokens
    for k in ks:
        neuronx.RUNTIME.events.clear()
        assert group.generators[k].generate(ids, 20).tokens == plain, k
        widths = {d["speculation_length"] for _, c, d in neuronx.RUNTIME.events if c == "speculative_forward"}
        assert widths == {k}


def test_engine_fused_through_the_pipeline_equals_plain_greedy_of_native(
    neuronx: ModuleType, tiny_model_dirs, tmp_path
) -> None:
    from neuron_ssp.errors import RuntimeProblem

    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    prompt = "w5 w9 w11 w5 w9 w40 w41"
    fused = load_pipeline(
        neuron_config(
            target, tiny_model_dirs["draft"], speculation={"engine": "fused"}, generation={"chat_template": False}
        )
    )
    ssp = fused.speculative(prompt)
    assert type(fused.generator).__name__ == "FusedEngine" and ssp.result.stats.target_calls > 0
    with pytest.raises(RuntimeProblem, match="engine: native"):
        fused.plain(prompt)
    native = load_pipeline(neuron_config(target, generation={"chat_template": False}))
    assert ssp.tokens == native.plain(prompt).tokens


@pytest.mark.parametrize("engine", ["native", "library"])
def test_extra_eos_ids_of_the_checkpoint_stop_a_neuron_generation(
    neuronx: ModuleType, tiny_model_dirs, tmp_path, engine: str
) -> None:
    """generation_config.json's ids (Llama-3.1's 128008, Llama-3-Instruct's 128009) end a generation on
    Neuron as on torch, though a transformers-neuronx model has no generation_config attribute."""
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = neuron_config(
        target, tiny_model_dirs["draft"], speculation={"engine": engine}, generation={"chat_template": False}
    )
    prompt = "w5 w9 w11 w5 w9 w40 w41"
    plain = load_pipeline(config).plain(prompt).tokens
    extra = next(t for t in plain[3:] if t != 2)  # a token the model generates, made an EOS of the checkpoint
    with_eos(target, [2, extra])
    pipeline = load_pipeline(config)
    assert pipeline.eos_token_ids == {2, extra}
    assert pipeline.speculative(prompt).tokens == plain[: plain.index(extra) + 1]
