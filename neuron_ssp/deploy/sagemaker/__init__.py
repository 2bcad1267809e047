"""SageMaker real-time endpoints for a validated config: plan, create, autoscale, invoke, delete.

One module per job: `instances` (ml.* types and hosting prices), `plan` (every request decided and
validated before any AWS call), `container` and `lmi` (the two serving engines), `lifecycle`
(create with cleanup on failure, status, scale, list, delete), `autoscaling`, `cloudwatch` (log
tail), `invoke` (request bodies and responses) and `image` (docker build and ECR push). boto3 is
imported lazily, as in the EC2 deploy.
"""
