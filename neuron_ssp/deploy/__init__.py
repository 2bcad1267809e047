"""Launch, run and tear down neuron-ssp on inf2/trn1 instances with boto3.

boto3 is an optional extra (`pip install 'neuron-ssp[deploy]'`); nothing here imports it at module
load, so the rest of the package works without it. Every AWS failure reaches the user as a
`Problem` (field, value, rule, fix), never as a botocore traceback.
"""
