"""Tools built on the generator: tune k, evaluate quality, benchmark speed against Hugging Face.

Each module is a library (functions returning dataclasses); `neuron_ssp.cli.tools` prints them.
"""
