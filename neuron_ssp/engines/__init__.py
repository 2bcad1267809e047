"""The loops that generate, one per `speculation.engine`, each offered to its callers as a `RowLoop` (rows.py):
requests join as rows between steps, and a step advances every running row.

- native: our loop (continuous_batch.py) over any backend, drafter, acceptor and policy, and plain decoding;
  rows join and leave a running batch (continuous batching);
- library: transformers-neuronx's own SpeculativeGenerator loop, for side-by-side comparison, and fused: its
  FusedSpeculativeDecoder (draft loop and acceptance on device); one library call runs every row that joined
  before it, to its end (static_batch.py);
- fused on NxD Inference: NxDI's fused speculation graph (nxdi_fused.py), rows joining and leaving where the
  target is compiled for a batch.

Engines drive backends; backends only score tokens and know nothing of acceptance.
"""
