"""Chain backends, deployment and the typed client of the verification game contract."""
