"""Topology: instance catalog, tp rules, NeuronCore placement, device-memory plan and the cache slots each
engine writes (positions.py). Pure logic.

The pipeline's loader and the deploy code call `validate_config` before loading anything and
`plan_deployment` to place the models.
"""

from neuron_ssp.topology.catalog import INSTANCES, Instance, hourly_price_usd
from neuron_ssp.topology.plan import DeploymentPlan, ModelPlan, plan_all_instances, plan_deployment
from neuron_ssp.topology.report import ValidationReport
from neuron_ssp.topology.validate import validate_config

__all__ = [
    "INSTANCES",
    "DeploymentPlan",
    "Instance",
    "ModelPlan",
    "ValidationReport",
    "hourly_price_usd",
    "plan_all_instances",
    "plan_deployment",
    "validate_config",
]
