"""Does the installed transformers-neuronx keep a batched call's cache ids? Its own host-side code, asked on the host.

`BatchedNeuronBackend` scores every row of a step in one call with 2-D cache_ids under continuous batching. Whether
those cache ids reach the device as sent is decided by the library's preprocessing (`_preprocess`, which `forward`
and, under continuous batching, `speculative_forward` run first): 0623de2, a 0.10 build that already takes
`enable_speculative_decoder(batch_sizes=)`, rewrites a 2-D window's cache ids to arange(context bucket)
(`_pad_cache_ids`, base.py:291-295), so every row's window lands on positions 0..k-1 with no error; c8d6bdc and
1ade6d7 keep them (base.py:285-288, :310-312 at c8d6bdc; :369-373, :467-471 at 1ade6d7), and 7a30b42 fails on a
window (no window branch, base.py:278-307). That code needs neither weights nor a device, so the loader runs the
installed build's own on exactly what our backend would send (`batched.call_inputs`), before anything is compiled.
A build is known by what it does, not by a keyword or a version string.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_ssp.backends.neuron.batched import call_inputs
from neuron_ssp.topology.networks import context_buckets

ROWS, K, N_POSITIONS = 2, 4, 256
WINDOW = {0: (100, torch.tensor([5, 6, 7, 8])), 1: (70, torch.tensor([9, 10]))}  # rows at different positions
STEP = {0: (104, torch.tensor([11])), 1: (72, torch.tensor([12]))}  # a one-token step of the same rows


def window_kept(llama_class: type, neuron_config_class: type, continuous_batching_class: type) -> str | None:
    """None when a window and a one-token step of two rows keep their cache ids through the installed build's
    preprocessing; else what came back, or what it raised."""
    model: Any = llama_class.__new__(llama_class)  # no __init__: no weights, no device; only what _preprocess reads
    vars(model).update(
        neuron_config=neuron_config_class(
            continuous_batching=continuous_batching_class(batch_size_for_shared_caches=ROWS)
        ),
        context_buckets=context_buckets(N_POSITIONS),
        decoder_lm_head_for_speculation={(K, ROWS): None},
    )
    for parts, width in ((WINDOW, K), (STEP, 1)):
        input_ids, cache_ids, seq_ids = call_inputs(parts, [0] * ROWS, width, N_POSITIONS)
        try:
            _, seen, *_ = model._preprocess(input_ids, start_ids=seq_ids, cache_ids=cache_ids)
        except Exception as exc:  # the library's own code refused the call: it does not keep the cache ids
            return f"{type(exc).__name__} ({exc}) for cache_ids {cache_ids.tolist()}"
        if tuple(seen.shape) != tuple(cache_ids.shape) or not torch.equal(seen.to(torch.int64), cache_ids):
            return f"cache_ids {seen[:, :width].tolist()}... ({tuple(seen.shape)}) for {cache_ids.tolist()}"
    return None
