"""What starts the service's processes: the workers' entry points and ``mnemos up``, the top of the service with the operator commands."""
