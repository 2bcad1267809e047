"""`neuron-ssp` command line. Each subcommand lives in its own module and is registered here."""

from __future__ import annotations

from neuron_ssp.cli import deploy as deploy_commands
from neuron_ssp.cli import endpoint as endpoint_commands
from neuron_ssp.cli import endpoint_image
from neuron_ssp.cli.app import main
from neuron_ssp.cli.config_show import config_command
from neuron_ssp.cli.draft import draft_data, train_draft
from neuron_ssp.cli.generate import compare, generate, latency
from neuron_ssp.cli.neuron import compile_command, doctor
from neuron_ssp.cli.prepare_draft import prepare_draft
from neuron_ssp.cli.serve import bench_serve, serve
from neuron_ssp.cli.tools import bench, eval_command, tune_k
from neuron_ssp.cli.topology import plan, validate

main.add_command(generate)
main.add_command(compare)
main.add_command(latency)
main.add_command(tune_k)
main.add_command(eval_command)
main.add_command(bench)
main.add_command(draft_data)
main.add_command(train_draft)
main.add_command(compile_command)
main.add_command(prepare_draft)
main.add_command(doctor)
main.add_command(validate)
main.add_command(config_command)
main.add_command(plan)
main.add_command(deploy_commands.deploy)
deploy_commands.deploy.add_command(endpoint_commands.endpoint)
deploy_commands.deploy.add_command(endpoint_image.image_group)
main.add_command(serve)
main.add_command(bench_serve)

__all__ = ["main"]
