"""Running the real NxD Inference (NxDI) Python on CPU in tests: import stubs for the closed-source Neuron
modules it imports, and the explicit, asserted patches of NxDI behaviour the CPU path needs.

Nothing here is imported by the package; tests reach it through tests/nxdi_fixtures.py.
"""
