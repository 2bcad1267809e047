"""Stand-in version: the numbering of the pip builds of the imitated API generation."""

from transformers_neuronx._standin import API

__version__ = "0.10.0.21" if API == "sdk_2_18" else "0.13.322"
