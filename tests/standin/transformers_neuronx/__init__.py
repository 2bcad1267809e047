"""Test stand-in for transformers-neuronx: the real public signatures, a tiny torch Llama inside.

Injected by the tests only (tests/standin is put on sys.path by a fixture). Set NEURONX_STANDIN_COMMIT to
7a30b42, 0623de2, c8d6bdc or 1ade6d7 (or NEURONX_STANDIN_API to sdk_2_18 / sdk_2_21, the first and the last) before
importing to imitate that commit; see _standin.py and neuronx_signatures.json.
"""

from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.version import __version__

__all__ = ["LlamaForSampling", "__version__"]
