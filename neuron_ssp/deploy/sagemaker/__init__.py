"""SageMaker real-time endpoints for a validated config: plan, create, autoscale, invoke, delete.

One module per job: `instances` (ml.* types and hosting prices), `plan` (every request decided and
validated before any AWS call), `container` and `lmi` (the two serving engines), `create` (with
cleanup on failure), `teardown`, `inventory` (status, list), `scale`, `autoscaling`, `cloudwatch`
(log tail), `invoke` (bodies and answers), `openai_client` and `image` (docker build, ECR push).
boto3 is imported lazily, as in the EC2 deploy.
"""
