"""`python -m neuron_ssp ...` runs the CLI with this interpreter, wherever pip put the console script."""

from neuron_ssp.cli import main

if __name__ == "__main__":
    main(prog_name="neuron-ssp")
