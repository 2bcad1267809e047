"""Stand-in of transformers_neuronx.utils: `get_qkv_padding`, present from c8d6bdc (SDK 2.19) on only.

The 0.10 commits (7a30b42, 0623de2) have no such function: it
replicates every kv head up to the query heads. The stand-in computes the padding with neuron_ssp's own
model of the rule (topology/parallelism.py, held against the source in tests/test_topology_padding.py).
"""

from neuron_ssp.topology.parallelism import heads_on_device
from transformers_neuronx import _standin

if _standin.COMMIT in ("c8d6bdc", "1ade6d7"):

    def get_qkv_padding(n_head: int, n_kv_head: int, tp_degree: int, neuron_config=None):
        return heads_on_device(n_head, n_kv_head, tp_degree)
