"""The embedded model's cache key and manifest: stale entries (old format, other transformers) are rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from neuron_ssp.embedded import models as embedded
from neuron_ssp.embedded.cache import MANIFEST, entry_dir, stale_reason, write_manifest

MAJOR = transformers.__version__.split(".")[0]


def fake_entry(directory: Path, gguf: Path) -> Path:
    """What a conversion leaves: the four files and a manifest describing them."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in {
        "config.json": '{"tie_word_embeddings": true}',
        "model.safetensors": "w" * 64,
        "tokenizer.json": "{}",
        "tokenizer_config.json": "{}",
    }.items():
        (directory / name).write_text(text)
    write_manifest(directory, gguf, "greedy continuation as expected")
    return directory


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "pkg" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" * 10)
    return path


def test_the_cache_key_carries_the_transformers_major_version(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    assert entry_dir("smollm2-135m-instruct") == tmp_path / f"smollm2-135m-instruct-transformers{MAJOR}"


def test_a_fresh_entry_is_current(tmp_path, gguf):
    entry = fake_entry(tmp_path / "entry", gguf)
    assert stale_reason(entry, gguf) is None
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["transformers"] == transformers.__version__ and manifest["files"]["model.safetensors"] == 64


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda e, g: (e / MANIFEST).unlink(), "no readable manifest"),
        (lambda e, g: _edit_manifest(e, format=1), "cache format 1"),
        (lambda e, g: _edit_manifest(e, transformers="3.99.0"), "written by transformers 3.99.0"),
        (lambda e, g: g.write_bytes(b"GGUF" * 11), "GGUF changed"),
        (lambda e, g: (e / "model.safetensors").write_text("w" * 10), "model.safetensors"),
        (lambda e, g: (e / "tokenizer.json").unlink(), "tokenizer.json"),
        (lambda e, g: (e / "config.json").write_text('{"tie_word_embeddings": fals}'), "config.json changed"),
    ],
)
def test_a_damaged_or_foreign_entry_is_stale(tmp_path, gguf, damage, reason):
    entry = fake_entry(tmp_path / "entry", gguf)
    damage(entry, gguf)
    assert reason in (stale_reason(entry, gguf) or "")


def _edit_manifest(entry: Path, **changes: object) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    (entry / MANIFEST).write_text(json.dumps({**manifest, **changes}))


def test_a_stale_entry_is_converted_again_and_a_current_one_is_not(tmp_path, gguf, monkeypatch, capsys):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "_gguf_path", lambda *a: gguf)
    conversions: list[Path] = []

    def convert(gguf_path: Path, target: Path, answer: object, label: str) -> None:
        conversions.append(target)
        fake_entry(target, gguf_path)

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    target = embedded.embedded_model_dir("smollm2-135m-instruct", "target.path")
    assert conversions == [target] and target.name == f"smollm2-135m-instruct-transformers{MAJOR}"
    embedded.embedded_model_dir("smollm2-135m-instruct", "target.path")
    assert len(conversions) == 1  # current: loaded as it is
    (target / MANIFEST).unlink()  # an entry written before manifests: its head may be random
    embedded.embedded_model_dir("smollm2-135m-instruct", "target.path")
    assert conversions == [target, target]
    assert "Rebuilding" in capsys.readouterr().err


def test_the_conversion_parses_a_gguf_once_and_restores_the_reader(tmp_path):
    """transformers and our tokenizer fix each open the GGUF; inside the conversion they share one parse."""
    import gguf

    from neuron_ssp.embedded.gguf_convert import _gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original = gguf.GGUFReader
    with _gguf_parsed_once():
        from gguf import GGUFReader  # what transformers does inside load_gguf_checkpoint

        first, second = GGUFReader(path), GGUFReader(str(path))
        assert first is second
        assert int(first.fields["tokenizer.ggml.bos_token_id"].parts[-1][0]) == 1
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(path) is not first


def test_the_conversion_builds_each_tensor_name_map_once_and_restores_gguf():
    """transformers 5.x asks for the map once per module; inside the conversion every ask gets the same one."""
    import gguf

    from neuron_ssp.embedded.gguf_convert import _tensor_maps_built_once

    original = gguf.get_tensor_name_map
    with _tensor_maps_built_once():
        from gguf import get_tensor_name_map  # what transformers does inside get_gguf_hf_weights_map

        first = get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is first
        assert get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not first
        assert first.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert gguf.get_tensor_name_map is original
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not first
