"""make compose-check: the Compose stacks started for real (check.py), on stand-in base images (standins.py)."""
