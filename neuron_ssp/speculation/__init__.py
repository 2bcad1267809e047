"""The speculative loop's swappable pieces and what it measures:

- acceptors: which drafted tokens the target keeps (transformers-neuronx's TokenAcceptor call shape);
- policies: how wide each window is (fixed, adaptive, draft- or target-confidence, cost: call_cost.py times
  the target per width, cost_policy.py keeps the part of a proposal that pays);
- sampling: logits -> probabilities -> tokens, the same transform for draft and target;
- stats: acceptance, accepted length, time split.
"""
