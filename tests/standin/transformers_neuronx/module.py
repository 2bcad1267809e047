"""Stand-in of transformers_neuronx.module: `from_pretrained` builds cls(AutoConfig, **kwargs)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, LlamaForCausalLM

from neuron_ssp.backends.torch.load import dtype_kwarg
from transformers_neuronx import _standin


class PretrainedModel(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        # Like the real one: unknown kwargs reach __init__'s **kwargs and are silently ignored.
        _standin.RUNTIME.record(Path(pretrained_model_path).name, "from_pretrained", **kwargs)
        config = AutoConfig.from_pretrained(pretrained_model_path)
        model = cls(config, *model_args, **kwargs)
        model.label = Path(pretrained_model_path).name
        model.load_state_dict_dir(pretrained_model_path)
        return model

    def load_state_dict_dir(self, pretrained_model_path):
        self.chkpt_model = LlamaForCausalLM.from_pretrained(
            str(pretrained_model_path), **{dtype_kwarg(): torch.float32}
        ).eval()
