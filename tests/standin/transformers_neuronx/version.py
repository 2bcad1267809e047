"""Stand-in version: the numbering of the pip builds of the imitated commit."""

from transformers_neuronx._standin import COMMIT, COMMITS

__version__ = COMMITS[COMMIT]
