"""Nitro on one machine: the supervised local system, its Redis server and the local Lambda endpoint."""
