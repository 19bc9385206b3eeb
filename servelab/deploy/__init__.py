"""Deployment targets past Docker Compose: the Kubernetes manifests in ``k8s/`` (built, schema-validated
and checked against ``docker/`` and :mod:`servelab.core.scaling` here, with no cluster)."""
