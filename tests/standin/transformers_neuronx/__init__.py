"""Test stand-in for transformers-neuronx: the real public signatures, a tiny torch Llama inside.

Injected by the tests only (tests/standin is put on sys.path by a fixture). Set NEURONX_STANDIN_API
to sdk_2_18 before importing to imitate the older API generation; see neuronx_signatures.json.
"""

from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.version import __version__

__all__ = ["LlamaForSampling", "__version__"]
