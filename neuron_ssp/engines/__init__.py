"""The loops that generate, one per `speculation.engine`:

- native: our SpeculativeGenerator (any backend, drafter, acceptor and policy) and plain decoding;
- library: transformers-neuronx's own SpeculativeGenerator loop, for side-by-side comparison;
- fused: transformers-neuronx's FusedSpeculativeDecoder (draft loop and acceptance on device).

Engines drive backends; backends only score tokens and know nothing of acceptance.
"""
