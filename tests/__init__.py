"""Makes tests/ a package, so its tests import their helpers as ``from .module import ...``."""
